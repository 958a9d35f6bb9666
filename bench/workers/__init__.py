"""The workers suite (`suite.py`): many worker processes idling and draining, and their cost."""
