"""The steady suite (`suite.py`): a worker keeping up with producers at rising rates."""
