"""The `pgqueue` command: the only part of pgqueue that reads argv (the DSN variables are
read by pgqueue.dsn, the rule Queue follows too).

Exit codes: 0 done, 1 the work failed, 2 the command line or configuration is wrong (and 3
from `watchdog`: holders found; 141 when the reader of the output went away, as after
`| head`). Terminal tables need `rich` (pip install 'pgqueue-py[cli]'); everything else needs
only pgqueue itself.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import psycopg

from pgqueue.cli import parser as cli_parser
from pgqueue.cli.target import UsageError, load_app
from pgqueue.errors import ConfigurationError, PgQueueError

__all__ = ["main"]

EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command cut off by `head`


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # here, not at exit, so a reader gone early is caught below
        return code
    except BrokenPipeError:
        # Whoever read the output stopped reading (`| head`): not a failure to report. Python
        # flushes stdout again at exit; pointing it at devnull keeps that flush quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


def _run(argv: Sequence[str] | None) -> int:
    parser = cli_parser.build()
    args, extra = parser.parse_known_args(argv)
    # The command line as given, for a supervisor that starts its workers with the same one.
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if extra:  # the subcommand's own usage, not the top-level one
        args.parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        args.app_loaded = load_app(args)
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
