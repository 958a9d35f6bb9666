"""Where `pgqueue relay` publishes: the `Sink` protocol, `Outgoing`, `Refused` and
`CallableSink`. They live in `pgqueue.relay.sinks`; this path stays for applications that
import them here, as the documentation shows."""

from pgqueue.relay.sinks import CallableSink, Outgoing, Refused, Sink

__all__ = ["CallableSink", "Outgoing", "Refused", "Sink"]
