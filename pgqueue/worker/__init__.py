"""The worker by role: `worker.py` wires the services and runs the claim-run loop; each other
module is one service or one concern of it. Applications import `pgqueue.Worker`."""
