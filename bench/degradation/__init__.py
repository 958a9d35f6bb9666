"""The degradation suite (`suite.py`): claims while a long transaction holds the horizon."""
