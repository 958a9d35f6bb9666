"""Enqueue through Django and SQLAlchemy against the bare psycopg enqueue, one job per
transaction, in the same run.

    python -m bench integrations [--dsn DSN] [--transactions 1500] [--rounds 10] [--out DIR]
                                 [--short]

One process, one connection per variant, on a fresh database (pgqueue's schema migrated, no
worker running), each transaction enqueueing one job:
- psycopg: `with conn.transaction(): queue.enqueue(task.job(i), conn=conn)`, the baseline;
- django: `with transaction.atomic(): task.enqueue(i)`, on Django's own connection through
  pgqueue.contrib.django (no conn=), as Django configures it by default: no prepared
  statements;
- django_prepared: the same on a database alias whose OPTIONS set psycopg's
  prepare_threshold to 5, so that its statements are prepared as pgqueue's own are;
- django_tasks: `with transaction.atomic(): djtask.enqueue(i)`, the django.tasks backend
  (only where Django 6 is installed: it needs Python 3.12);
- sqlalchemy: `with Session(engine) as s, s.begin(): queue.enqueue(task.job(i), conn=s)`,
  an engine on the psycopg driver with a pool of one: a session per transaction, as a web
  request has;
- sqlalchemy_kept_session: one Session kept, `with session.begin(): ...` per transaction, so
  the figure leaves out what making and closing a Session costs.
Controls: the same transaction in psycopg, Django and SQLAlchemy writing one row of a plain
table instead (`INSERT INTO bench_rows (payload) VALUES (...)`), so that what each framework
costs by itself shows beside what the enqueue costs in it.
The variants take turns for --rounds rounds of --transactions each, each round starting with
the next one, so drift on the machine falls on all of them; each variant's figure is its
median round. Ratios are to psycopg's enqueue, and to each framework's own INSERT.

Writes results.json to its results folder (bench/report.py) and prints a summary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg

from bench import options
from bench.report import Run, guarded
from bench.server import database, scratch_database
from pgqueue import Queue

# The Queue pgqueue.contrib.django loads by name (PGQUEUE["QUEUE"]), set once the schema is.
QUEUE: Queue | None = None


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = options.parser(
        "integrations",
        __doc__.split("\n\n")[0],
        short="the CI run: 2 rounds of 200 transactions",
    )
    parser.add_argument("--transactions", type=int, help="per variant and round (default 1500)")
    parser.add_argument("--rounds", type=int, help="rounds the variants take turns (default 10)")
    args = parser.parse_args(argv)
    options.sized(
        args,
        short={"transactions": 200, "rounds": 2},
        full={"transactions": 1500, "rounds": 10},
    )
    options.positive(parser, {"--transactions": args.transactions, "--rounds": args.rounds})
    return args


def _setup_django(dsn: str) -> bool:
    """Django configured on `dsn` with pgqueue's app; True if django.tasks is there too."""
    import django
    from django.conf import settings

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    tasks_api = django.VERSION >= (6, 0)
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": info.get("dbname", "postgres"),
        "USER": info.get("user", ""),
        "PASSWORD": info.get("password", ""),
        "HOST": info.get("host", ""),
        "PORT": info.get("port", ""),
    }
    settings.configure(
        INSTALLED_APPS=["pgqueue.contrib.django"],
        DATABASES={
            "default": database,
            # The same database, on a connection that prepares statements it runs often.
            "prepared": database | {"OPTIONS": {"prepare_threshold": 5}},
        },
        PGQUEUE={"QUEUE": "bench.integrations.suite:QUEUE"},
        TASKS={
            "default": {
                "BACKEND": "pgqueue.contrib.django.Backend",
                "OPTIONS": {"MODULES": ["bench"]},
            }
        },
        USE_TZ=True,
    )
    django.setup()
    return tasks_api


@contextmanager
def variants(dsn: str, queue: Queue) -> Iterator[dict[str, Callable[[int], None]]]:
    """Each variant as one transaction enqueueing job `i`."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    task = queue.task(name="bench.integrations.noop")(_noop)
    with_tasks_api = _setup_django(dsn)
    from django.db import connections, transaction

    conn = psycopg.connect(dsn, autocommit=True)
    engine = create_engine(
        "postgresql+psycopg://",
        creator=lambda: psycopg.connect(dsn),
        pool_size=1,
        max_overflow=0,
    )

    def bare(i: int) -> None:
        with conn.transaction():
            queue.enqueue(task.job(i), conn=conn)

    def django_atomic(i: int) -> None:
        with transaction.atomic():
            task.enqueue(i)

    # A Queue on the "prepared" alias, as PGQUEUE = {"DATABASE": "prepared"} would make it.
    prepared = Queue(schema=queue.schema)
    prepared.use_connection(lambda: _raw(connections["prepared"]))

    def django_prepared(i: int) -> None:
        with transaction.atomic(using="prepared"):
            prepared.enqueue(task.job(i))

    def sqlalchemy_session(i: int) -> None:
        with Session(engine) as session, session.begin():
            queue.enqueue(task.job(i), conn=session)

    kept = Session(engine)

    def sqlalchemy_kept_session(i: int) -> None:
        with kept.begin():
            queue.enqueue(task.job(i), conn=kept)

    made: dict[str, Callable[[int], None]] = {
        "psycopg": bare,
        "django": django_atomic,
        "django_prepared": django_prepared,
        "sqlalchemy": sqlalchemy_session,
        "sqlalchemy_kept_session": sqlalchemy_kept_session,
    }
    # Controls: the same transaction in each framework writing a row of the application's
    # own (a plain INSERT of a JSON payload), so that what the framework itself costs shows.
    row = "INSERT INTO bench_rows (payload) VALUES (%s::jsonb)"

    def psycopg_insert(i: int) -> None:
        with conn.transaction():
            conn.execute(row, [f'{{"i": {i}}}'])

    def django_insert(i: int) -> None:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute(row, [f'{{"i": {i}}}'])

    def sqlalchemy_insert(i: int) -> None:
        with Session(engine) as session, session.begin():
            session.execute(
                text("INSERT INTO bench_rows (payload) VALUES (CAST(:p AS jsonb))"),
                {"p": f'{{"i": {i}}}'},
            )

    made |= {
        "control_psycopg_insert": psycopg_insert,
        "control_django_insert": django_insert,
        "control_sqlalchemy_insert": sqlalchemy_insert,
    }
    if with_tasks_api:
        from bench.integrations.tasks import noop as djtask

        def django_tasks(i: int) -> None:
            with transaction.atomic():
                djtask.enqueue(i)

        made["django_tasks"] = django_tasks
    try:
        yield made
    finally:
        conn.close()
        kept.close()
        engine.dispose()
        connections.close_all()


def _raw(wrapper: Any) -> psycopg.Connection[Any]:
    wrapper.ensure_connection()
    raw: psycopg.Connection[Any] = wrapper.connection
    return raw


def _noop(i: int) -> None:
    """Never run: no worker runs in this bench."""


def measure(variant: Callable[[int], None], transactions: int, start: int) -> float:
    """Transactions per second over `transactions` calls."""
    began = time.perf_counter()
    for i in range(start, start + transactions):
        variant(i)
    return transactions / (time.perf_counter() - began)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    run = Run("integrations", argv, args.out, args.short)
    return guarded("integrations", lambda: bench(run, args))


def bench(run: Run, args: argparse.Namespace) -> int:
    global QUEUE
    import django
    import sqlalchemy

    with (
        database(options.dsn(args.dsn)) as server,
        scratch_database(server.dsn, "bench_integrations") as dsn,
    ):
        out = run.folder(server)
        QUEUE = Queue(schema="pgqueue")
        with psycopg.connect(dsn, autocommit=True) as conn:
            QUEUE.migrate(conn=conn)
            conn.execute("CREATE TABLE bench_rows (id bigserial PRIMARY KEY, payload jsonb)")
        rounds: dict[str, list[float]] = {}
        with variants(dsn, QUEUE) as made:
            for variant in made.values():  # a warm-up: connections, prepared statements
                measure(variant, min(200, args.transactions), 0)
            names = list(made)
            for r in range(args.rounds):
                turn = names[r % len(names) :] + names[: r % len(names)]  # each goes first once
                for name in turn:
                    start = (r + 1) * args.transactions
                    rate = measure(made[name], args.transactions, start)
                    rounds.setdefault(name, []).append(rate)
        with psycopg.connect(dsn) as conn:
            stored = conn.execute("SELECT count(*) FROM pgqueue.jobs").fetchone()[0]
        medians = {name: statistics.median(rates) for name, rates in rounds.items()}
        base = medians["psycopg"]
        figures: dict[str, Any] = {
            "transactions": args.transactions,
            "rounds": args.rounds,
            "versions": {
                "psycopg": psycopg.__version__,
                "django": django.__version__,
                "sqlalchemy": sqlalchemy.__version__,
                "python": sys.version.split()[0],
            },
            "jobs_stored": stored,
            "per_second": {name: round(rate) for name, rate in medians.items()},
            "rounds_per_second": {n: [round(x) for x in r] for n, r in rounds.items()},
            "ratio_to_psycopg": {name: round(rate / base, 3) for name, rate in medians.items()},
            "us_per_transaction": {name: round(1e6 / rate) for name, rate in medians.items()},
            # What the enqueue costs in each framework next to the framework's own INSERT.
            "ratio_to_own_insert": {
                name: round(medians[name] / medians[f"control_{control}_insert"], 3)
                for name, control in (
                    ("psycopg", "psycopg"),
                    ("django", "django"),
                    ("sqlalchemy", "sqlalchemy"),
                )
            },
        }
        # A framework's transaction costs the same extra time whatever it writes; what the
        # integration adds is what its enqueue costs beyond that.
        us = figures["us_per_transaction"]
        framework = {
            name: us[f"control_{name}_insert"] - us["control_psycopg_insert"]
            for name in ("django", "sqlalchemy")
        }
        figures["framework_us"] = framework
        figures["integration_us"] = {
            "django": us["django"] - us["psycopg"] - framework["django"],
            "django_prepared": us["django_prepared"] - us["psycopg"] - framework["django"],
            "sqlalchemy": us["sqlalchemy"] - us["psycopg"] - framework["sqlalchemy"],
        }
        run.write(out, "results.json", server, figures)
    print(
        f"PostgreSQL {server.version}: one job per transaction, median of {args.rounds} "
        f"rounds of {args.transactions:,}"
    )
    for name, rate in figures["per_second"].items():
        print(f"  {name:<26} {rate:>7,}/s  {figures['ratio_to_psycopg'][name]:.2f} of psycopg")
    for name, ratio in figures["ratio_to_own_insert"].items():
        print(f"  {name} enqueue: {ratio:.2f} of the same transaction writing its own row")
    for name, cost in figures["framework_us"].items():
        print(f"  a {name} transaction costs {cost} us more than psycopg's, whatever it writes")
    for name, cost in figures["integration_us"].items():
        print(f"  the {name} enqueue adds {cost} us beyond that")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
