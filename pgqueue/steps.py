"""The rules of durable calls' names, which a worker's handler and an application's
`Queue.signal` both check.

Owns: how long a step's (sleep's, wait's) name and a signal's key may be, and the check that
refuses one that is not a non-empty string of at most that many characters. Unlike a task's
or a queue's name (models.check_identifier), these are free text: any characters but NUL.
"""

from __future__ import annotations

from pgqueue.errors import ConfigurationError

KEY_MAX = 1000  # characters of a signal's key
NAME_MAX = 200  # characters of a step's name


def check_label(kind: str, name: str, longest: int = NAME_MAX) -> str:
    """A step's name or a signal's key: a non-empty string of at most `longest` characters,
    without NUL; ConfigurationError naming `kind` otherwise."""
    if not isinstance(name, str) or not name or len(name) > longest or "\x00" in name:
        raise ConfigurationError(
            f"a {kind} is a non-empty string of at most {longest} characters, got {name!r}"
        )
    return name
