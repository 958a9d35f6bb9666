"""The outbox relay: `Relay` (in `publisher.py`) publishes staged messages to brokers through
the sinks in `sinks/`. Applications import `Relay` from here."""

from pgqueue.relay.publisher import Relay, RelayStats

__all__ = ["Relay", "RelayStats"]
