"""The memory suite (`suite.py`): a worker's resident set, idle and draining."""
