"""The command line every suite shares: `python -m bench SUITE [--dsn DSN] [--out DIR] ...`.

Each suite adds its own options to `parser(...)`; the DSN and the output folder mean the
same everywhere, and a malformed value is a usage error (exit 2) that names the option.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence
from pathlib import Path


def parser(suite: str, description: str, *, short: str | None = None) -> argparse.ArgumentParser:
    """A suite's parser with the shared options; `short`, if given, is the help of --short
    (a suite's CI-sized run)."""
    made = argparse.ArgumentParser(prog=f"python -m bench {suite}", description=description)
    made.add_argument(
        "--dsn", help="the PostgreSQL server to use (default: PGQUEUE_DSN, else an embedded one)"
    )
    made.add_argument(
        "--out",
        type=Path,
        help=f"output folder (default: bench/results/{suite}/pgNN, replaced by each full run; "
        f"bench/out/{suite}-short for --short)",
    )
    if short is not None:
        made.add_argument("--short", action="store_true", help=short)
    return made


def sized(args: argparse.Namespace, short: dict[str, object], full: dict[str, object]) -> None:
    """Each of these options left unset takes its --short default or its full-run one."""
    for name, value in (short if args.short else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def dsn(value: str | None) -> str | None:
    """The server a suite uses: --dsn, else PGQUEUE_DSN, else None (an embedded one)."""
    return value or os.environ.get("PGQUEUE_DSN") or None


def command(suite: str, argv: Sequence[str]) -> str:
    """The exact command, as recorded beside the figures it produced."""
    return shlex.join(["python", "-m", "bench", suite, *argv])


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
