"""The rates suite (`suite.py`): what a rate limit costs a claim, and whether it holds."""
