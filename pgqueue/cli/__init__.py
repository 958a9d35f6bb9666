"""The `pgqueue` command. The only part of pgqueue that reads argv and the environment.

Exit codes: 0 done, 1 the work failed, 2 the command line or configuration is wrong (and 3
from `watchdog`: holders found). Terminal tables need `rich` (pip install 'pgqueue-py[cli]');
everything else needs only pgqueue itself.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

import psycopg

from pgqueue.cli import parser as cli_parser
from pgqueue.cli.commands import UsageError
from pgqueue.errors import ConfigurationError, PgQueueError

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = cli_parser.build()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's own usage, not the top-level one
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.handler(args)
        return code
    except (UsageError, ConfigurationError) as exc:
        print(f"pgqueue: error: {exc}", file=sys.stderr)
        return 2
    except PgQueueError as exc:
        print(f"pgqueue: error: {exc}", file=sys.stderr)
        return 1
    except psycopg.Error as exc:
        print(f"pgqueue: database error: {type(exc).__name__}: {exc}".strip(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
