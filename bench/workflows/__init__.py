"""The workflows suite (`suite.py`): waiting jobs against the claim, and a big chord's fan-in."""
