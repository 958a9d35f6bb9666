"""The partitions suite (`suite.py`): dropping a day of history against DELETE."""
