"""The trigger of welcome.sql at work, in one command: `python welcome.py`.

Uses DATABASE_URL (postgresql://...) if set, else a throwaway embedded PostgreSQL in
./.pgqueue/. Installs the trigger, inserts users (one insert rolls back), runs a worker
process (`pgqueue worker welcome:queue --burst`), and prints each job the trigger made.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

from pgqueue import Queue

HERE = Path(__file__).resolve().parent


def database() -> str:
    given = os.environ.get("DATABASE_URL")
    if given:
        return given
    from pgqueue import embedded

    return embedded.start(HERE / ".pgqueue").dsn


DSN = database()
queue = Queue(DSN)


@queue.task(name="app.send_welcome", queue="mail")
def send_welcome(user_id: int, email: str) -> str:
    return f"welcome mail to {email} (user {user_id})"


if __name__ == "__main__":
    queue.migrate()
    # The task's declared queue ('mail') where the trigger's enqueue() reads it; a worker's
    # start writes it too, but these inserts come first.
    queue.sync_tasks()
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute((HERE / "welcome.sql").read_text())
        with conn.transaction():
            conn.execute("INSERT INTO users (email) VALUES ('ada@example.com')")
        try:
            with conn.transaction():
                conn.execute("INSERT INTO users (email) VALUES ('bob@example.com')")
                raise RuntimeError("signup failed")  # the row and its job go together
        except RuntimeError:
            pass
        # One statement, three rows: a job per row, and one wake-up for the transaction.
        conn.execute(
            "INSERT INTO users (email) SELECT unnest(%s::text[])",
            [["cy@example.com", "dee@example.com", "eve@example.com"]],
        )
    worked = subprocess.run(
        [sys.executable, "-m", "pgqueue", "worker", "welcome:queue", "--burst",
         "--queues", "mail", "--dsn", DSN],
        cwd=HERE,
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )  # fmt: skip
    for job in reversed(queue.list_jobs(task="app.send_welcome").jobs):
        print(f"job {job.id} {job.args['email']}: {job.status.value}, {job.result!r}")
    queue.close()  # the pool list_jobs opened
    sys.exit(worked.returncode)
