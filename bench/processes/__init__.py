"""The processes suite (`suite.py`): one `pgqueue worker --processes N` against another."""
