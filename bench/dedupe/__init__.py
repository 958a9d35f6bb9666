"""The dedupe suite (`suite.py`): what a dedupe key costs at enqueue."""
