"""The integrations suite (`suite.py`): enqueue through Django and SQLAlchemy against psycopg."""
