"""The tenants suite (`suite.py`) and `tenants-overadmit` (`overadmit.py`): per-key limits."""
