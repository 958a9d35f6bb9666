"""The durable bench: what checkpointed steps, parked jobs and waits for results cost."""
