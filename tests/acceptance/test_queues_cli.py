"""`pgqueue queues pause|resume|list` as an operator runs them: a real process, a real
PostgreSQL."""

from __future__ import annotations

import json

from pgqueue import Queue
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.apps import tasks as apps


def test_queues_pause_list_and_resume(dsn: str, schema: str) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    Queue(dsn, schema=schema).enqueue_many([apps.noop.job(), apps.noop.job()])
    paused = run_pgqueue("queues", "pause", "default", "reports", "--reason", "incident 42", *where)
    assert paused.returncode == 0, paused.stderr
    assert "default: paused" in paused.stderr and "reports: paused" in paused.stderr
    again = run_pgqueue("queues", "pause", "default", *where)
    assert "default: was paused already" in again.stderr

    listed = json.loads(run_pgqueue("queues", "list", "--json", *where).stdout)
    rows = {row["queue"]: row for row in listed}
    assert set(rows) == {"default", "reports"}
    assert rows["default"]["paused"] and rows["default"]["queued"] == 2
    assert rows["reports"]["reason"] == "incident 42" and rows["reports"]["queued"] == 0
    table = run_pgqueue("queues", "list", *where).stdout
    assert "paused" in table and "incident 42" in table
    status = json.loads(run_pgqueue("status", "--json", *where).stdout)
    assert [(q["queue"], q["paused"]) for q in status["queues"]] == [("default", True)]

    resumed = run_pgqueue("queues", "resume", "default", "other", *where)
    assert resumed.returncode == 0, resumed.stderr
    assert "default: resumed" in resumed.stderr and "other: was not paused" in resumed.stderr
    rows = {
        r["queue"]: r for r in json.loads(run_pgqueue("queues", "list", "--json", *where).stdout)
    }
    assert not rows["default"]["paused"] and rows["reports"]["paused"]


def test_queues_refuses_a_bad_name_or_no_name(dsn: str, schema: str) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    assert_usage_error(run_pgqueue("queues", "pause", *where), "QUEUE")
    assert_usage_error(run_pgqueue("queues", "pause", "has space", *where), "queue")
    assert_usage_error(run_pgqueue("queues", "stop", "x", *where), "invalid choice")


def test_queues_limit_list_and_unlimit(dsn: str, schema: str) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    Queue(dsn, schema=schema).migrate()
    limited = run_pgqueue("queues", "limit", "sms", "600/m", *where)
    assert limited.returncode == 0, limited.stderr
    assert "sms: at most 600/m starts" in limited.stderr
    rows = {
        r["queue"]: r for r in json.loads(run_pgqueue("queues", "list", "--json", *where).stdout)
    }
    assert rows["sms"]["rate_limit"]["max_starts"] == 600
    assert rows["sms"]["rate_limit"]["period"] == 60.0
    assert "600/60s" in run_pgqueue("queues", "list", *where).stdout
    bad = run_pgqueue("queues", "limit", "sms", "many", *where)
    assert bad.returncode == 2 and "N/s" in bad.stderr and "Traceback" not in bad.stderr
    removed = run_pgqueue("queues", "unlimit", "sms", *where)
    assert "sms: no rate limit now" in removed.stderr
    again = run_pgqueue("queues", "unlimit", "sms", *where)
    assert "sms: had no rate limit" in again.stderr
    assert json.loads(run_pgqueue("queues", "list", "--json", *where).stdout) == []


def test_rates_set_list_and_remove_for_queues_tasks_and_keys(dsn: str, schema: str) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    Queue(dsn, schema=schema).migrate()
    for scope, rate in (
        (("--queue", "sms"), "5/s"),
        (("--task", "mail.send"), "600/m"),
        (("--key", "tenant-1"), "100/h"),
        (("--default-key",), "2/s"),
    ):
        done = run_pgqueue("rates", "set", *scope, rate, *where)
        assert done.returncode == 0, done.stderr
        assert f"at most {rate} starts" in done.stderr
    listed = json.loads(run_pgqueue("rates", "list", "--json", *where).stdout)
    assert [(r["queue"], r["task"], r["key"], r["max_starts"]) for r in listed] == [
        ("sms", None, None, 5),
        (None, "mail.send", None, 600),
        (None, None, "*", 2),
        (None, None, "tenant-1", 100),
    ]
    table = run_pgqueue("rates", "list", *where).stdout
    assert "task mail.send" in table and "600/60s" in table and "key * (default)" in table
    # Queue-level views show queues only.
    assert [
        r["queue"] for r in json.loads(run_pgqueue("queues", "list", "--json", *where).stdout)
    ] == ["sms"]
    removed = run_pgqueue("rates", "remove", "--task", "mail.send", *where)
    assert removed.returncode == 0 and "task mail.send: no rate limit now" in removed.stderr
    bad = run_pgqueue("rates", "set", "--key", "*", "1/s", *where)
    assert bad.returncode == 2 and "--default" in bad.stderr and "Traceback" not in bad.stderr
    assert_usage_error(run_pgqueue("rates", "set", "1/s", *where), "--queue")
