"""The relay suites: `relay-throughput`, `relay-degradation` and `relay-chaos`, one module each."""
