"""The throughput suite (`suite.py`): pgqueue, its Python peers and the raw SQL bound; and
`throughput-pairs` (`pairs.py`), bulk enqueue against a raw COPY."""
