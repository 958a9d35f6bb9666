"""A throwaway Citus cluster on this machine: a coordinator and worker nodes, each its own
PostgreSQL server in a temporary directory on a free loopback port.

For the Citus tests and benches; `single()` starts one plain server with the same settings,
for the benches to compare with. Citus is built into a PostgreSQL install by
../shared/citus/build.sh (`installed()` says whether it is there); nothing here installs it.
Run as root, the servers run as the `postgres` user, whom PostgreSQL requires.

    with cluster.running(nodes=2) as c:
        c.coordinator   # the DSN an application and `pgqueue migrate --citus` use
        c.nodes         # each worker node's DSN
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("PGQUEUE_CITUS_PG_BIN", "/usr/lib/postgresql/15/bin"))
# Small enough that laying out a schema stays quick, large enough that values spread over
# both nodes.
SHARD_COUNT = 8
SETTINGS = {
    "shared_preload_libraries": "'citus'",
    "max_prepared_transactions": "100",
    "max_connections": "120",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "citus.shard_count": str(SHARD_COUNT),
    "log_min_messages": "warning",
}


def installed() -> str | None:
    """None when Citus can run here, else why not."""
    if not (PG_BIN / "initdb").exists():
        return f"no PostgreSQL at {PG_BIN} (PGQUEUE_CITUS_PG_BIN)"
    libdir = subprocess.run(
        [str(PG_BIN / "pg_config"), "--pkglibdir"], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not (Path(libdir) / "citus.so").exists():
        return f"citus is not installed in {libdir}: run ../shared/citus/build.sh"
    return None


@dataclass
class Cluster:
    folder: Path
    ports: list[int]
    stopped: bool = field(default=False)

    @property
    def coordinator(self) -> str:
        return dsn(self.ports[0])

    @property
    def nodes(self) -> list[str]:
        return [dsn(port) for port in self.ports[1:]]

    def data(self, index: int) -> Path:
        return self.folder / f"server{index}"

    def restart(self, index: int) -> None:
        """Restart one server fast (its connections are cut), for fault tests."""
        # -l: a server started without a log file holds this process's pipes open.
        data = self.data(index)
        _pg_ctl(data, "-m", "fast", "-l", str(data / "server.log"), "restart")

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for index in range(len(self.ports)):
            if (self.data(index) / "postmaster.pid").exists():
                _pg_ctl(self.data(index), "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)


def dsn(port: int) -> str:
    return f"postgresql://postgres@127.0.0.1:{port}/postgres"


def start(nodes: int = 2, settings: dict[str, str] | None = None) -> Cluster:
    """Start a coordinator and `nodes` worker nodes with the citus extension, the nodes added
    to the coordinator's metadata; `settings` added to SETTINGS. The caller must stop() it."""
    why = installed()
    if why:
        raise RuntimeError(why)
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-citus-"))
    _give_to_postgres(folder)
    cluster = Cluster(folder, [_free_port() for _ in range(nodes + 1)])
    try:
        for index, port in enumerate(cluster.ports):
            _start_server(cluster.data(index), port, folder, {**SETTINGS, **(settings or {})})
        for port in cluster.ports:
            with psycopg.connect(dsn(port), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
        with psycopg.connect(cluster.coordinator, autocommit=True) as conn:
            conn.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)", [cluster.ports[0]])
            for port in cluster.ports[1:]:
                conn.execute("SELECT citus_add_node('127.0.0.1', %s)", [port])
    except BaseException:
        cluster.stop()
        raise
    return cluster


@contextlib.contextmanager
def running(nodes: int = 2, settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    cluster = start(nodes, settings)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def single(settings: dict[str, str] | None = None) -> Iterator[Cluster]:
    """One plain PostgreSQL server of the same install and settings, without Citus."""
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-plain-"))
    _give_to_postgres(folder)
    server = Cluster(folder, [_free_port()])
    try:
        plain = {k: v for k, v in SETTINGS.items() if "citus" not in k and "citus" not in v}
        plain.update(settings or {})
        _start_server(server.data(0), server.ports[0], folder, plain)
        yield server
    finally:
        server.stop()


def _start_server(
    data: Path, port: int, sockets: Path, settings: dict[str, str] | None = None
) -> None:
    _as_postgres([str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust"])
    with (data / "postgresql.conf").open("a") as conf:
        for name, value in {**(settings or SETTINGS), "port": str(port)}.items():
            conf.write(f"{name} = {value}\n")
        conf.write(f"unix_socket_directories = '{sockets}'\n")
    _pg_ctl(data, "-l", str(data / "server.log"), "start")


def _pg_ctl(data: Path, *args: str, check: bool = True) -> None:
    _as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(data), "-w", "-t", "60", *args], check=check)


def _as_postgres(command: list[str], check: bool = True) -> None:
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()}")


def _give_to_postgres(folder: Path) -> None:
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":  # a cluster to try things on, until Enter
    with running() as c:
        print("coordinator:", c.coordinator)
        print("nodes:", " ".join(c.nodes))
        input("Enter stops it. ")
