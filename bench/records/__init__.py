"""The records suite (`suite.py`): reading job records from a large history."""
