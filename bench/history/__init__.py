"""The history suite (`suite.py`): pruning and reading a history of 1M jobs."""
