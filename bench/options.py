"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def choices(
    parser: argparse.ArgumentParser, flag: str, value: str, allowed: Sequence[str]
) -> tuple[str, ...]:
    """Comma-separated distinct values from `allowed`; anything else is a usage error."""
    chosen = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [v for v in chosen if v not in allowed]
    if not chosen or unknown or len(set(chosen)) != len(chosen):
        parser.error(f"{flag} takes distinct values from {','.join(allowed)}, got {value!r}")
    return chosen


def positive(parser: argparse.ArgumentParser, values: dict[str, float]) -> None:
    """Every flag's number must be greater than 0; anything else is a usage error."""
    for flag, value in values.items():
        if value <= 0:
            parser.error(f"{flag} must be greater than 0, got {value}")
