"""What every long-lived pgqueue process shares (the worker, the relay, history upkeep): the
service lifecycle (`service.py`) and the database link that comes back after faults
(`link.py`)."""
