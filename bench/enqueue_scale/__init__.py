"""The enqueue-scale suite (`suite.py`): enqueue from many connections against a raw INSERT."""
