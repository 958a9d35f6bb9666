"""A real PgBouncer in transaction pooling mode, in front of a server, on a free port: for
the suites and tests that run through one.

Debian's `pgbouncer` package provides it (.ci/run installs it). PgBouncer refuses to run as
root, so as root it drops to `nobody`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

BINARIES = ("pgbouncer", "/usr/sbin/pgbouncer")


def binary() -> str | None:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    return None


def unusable(dsn: str) -> str | None:
    """Why PgBouncer cannot stand in front of `dsn`'s server here, or None if it can."""
    if binary() is None:
        return "PgBouncer is not installed: apt-get install pgbouncer (.ci/run does)"
    host = str(conninfo_to_dict(dsn).get("host") or "")
    if host.startswith("/") and os.geteuid() == 0:
        # PgBouncer drops root for `nobody`, who cannot reach a socket in a private folder
        # (the embedded server's).
        return f"the server listens on a socket in {host}, which PgBouncer as nobody cannot reach"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def running(dsn: str, pool_size: int = 20) -> Iterator[str]:
    """Start PgBouncer (transaction pooling) in front of `dsn`'s server; yields the DSN that
    goes through it, to the same database and user."""
    found = binary()
    reason = unusable(dsn)
    if found is None or reason is not None:
        raise RuntimeError(reason)
    target = conninfo_to_dict(dsn)
    host = str(target.get("host") or "127.0.0.1")
    port, user = _free_port(), str(target.get("user") or "postgres")
    with tempfile.TemporaryDirectory(prefix="pgq-bouncer-") as tmp:
        folder = Path(tmp)
        folder.chmod(0o755)  # readable by `nobody` when PgBouncer drops root
        (folder / "users.txt").write_text(f'"{user}" ""\n')
        ini = folder / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={host} port={target.get('port') or 5432}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {folder / 'users.txt'}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 500\n"
            # psycopg sets these at connect time; PgBouncer must let them through.
            "ignore_startup_parameters = extra_float_digits,options\n"
            "server_reset_query =\n"
        )
        for path in folder.iterdir():
            path.chmod(0o644)
        command = [found, str(ini)]
        if os.geteuid() == 0:
            command = [found, "-u", "nobody", str(ini)]
        log = folder / "pgbouncer.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        through = make_conninfo(
            dsn, host="127.0.0.1", port=str(port), hostaddr="", sslmode="disable"
        )
        try:
            deadline = time.monotonic() + 15
            while True:
                try:
                    psycopg.connect(through, connect_timeout=2).close()
                    break
                except psycopg.OperationalError as exc:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        proc.kill()
                        proc.wait()
                        tail = log.read_text()[-2000:]
                        raise RuntimeError(f"PgBouncer did not start: {tail}") from exc
                    time.sleep(0.1)
            yield through
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
