"""The job history's upkeep: its daily partitions (`partitions.py`) and retention's pruning
(`retention.py`), run by the workers and by `pgqueue prune`."""
