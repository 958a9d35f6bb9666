"""The chaos suite (`suite.py`): kill -9, restarts and faults; nothing lost, nothing run twice."""
