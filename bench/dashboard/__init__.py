"""The dashboard suite (`suite.py`): its pages and /metrics at a large history."""
