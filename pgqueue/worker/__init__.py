"""The worker by role: `worker.py` is its public face, `run.py` wires one run's services,
`loop.py` runs the claim-run loop, and `events.py` carries what the services tell each other;
each other module is one service or one concern of it. Applications import `pgqueue.Worker`."""
