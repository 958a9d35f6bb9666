"""`pgqueue tenants set|remove|list` as a user runs them: a real process, a real PostgreSQL."""

from __future__ import annotations

import json

from pgqueue import Queue
from tests.acceptance.test_cli import assert_usage_error, run_pgqueue
from tests.apps.tasks import noop


def test_tenants_set_list_and_remove_limits_and_the_default(dsn: str, schema: str) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    assert run_pgqueue("tenants", "set", "acme", "--max-running", "3", *where).returncode == 0
    assert run_pgqueue("tenants", "set", "--default", "--max-running", "1", *where).returncode == 0
    listed = run_pgqueue("tenants", "list", "--json", *where)
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [
        {"key": "*", "max_running": 1, "running": 0, "waiting": 0},
        {"key": "acme", "max_running": 3, "running": 0, "waiting": 0},
    ]
    table = run_pgqueue("tenants", "list", *where)
    assert "* (default)" in table.stdout and "acme" in table.stdout
    assert run_pgqueue("tenants", "remove", "acme", *where).returncode == 0
    assert run_pgqueue("tenants", "remove", "--default", *where).returncode == 0
    assert json.loads(run_pgqueue("tenants", "list", "--json", *where).stdout) == []


def test_tenants_set_refuses_a_missing_key_a_bad_limit_or_both_forms(dsn: str, schema: str) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    assert_usage_error(run_pgqueue("tenants", "set", "--max-running", "2", *where), "KEY")
    assert_usage_error(
        run_pgqueue("tenants", "set", "a", "--default", "--max-running", "2", *where), "--default"
    )
    assert_usage_error(run_pgqueue("tenants", "set", "a", "--max-running", "-1", *where), "-1")
    assert_usage_error(
        run_pgqueue("tenants", "set", "*", "--max-running", "1", *where), "concurrency key '*'"
    )


def test_tenants_weight_sets_and_removes_a_weight_and_shares_lists_it(
    dsn: str, schema: str
) -> None:
    where = ("--dsn", dsn, "--schema", schema)
    set_ = run_pgqueue("tenants", "weight", "acme", "2.5", *where)
    assert set_.returncode == 0 and "weight 2.5" in set_.stderr, set_.stderr
    queue = Queue(dsn, schema=schema)
    try:
        queue.enqueue(noop.with_options(fairness_key="acme").job())
    finally:
        queue.close()
    listed = run_pgqueue("tenants", "shares", "--json", *where)
    assert listed.returncode == 0, listed.stderr
    [acme] = json.loads(listed.stdout)
    assert (acme["key"], acme["weight"], acme["queued"], acme["owed"]) == ("acme", 2.5, 1, 1.0)
    assert "acme" in run_pgqueue("tenants", "shares", *where).stdout
    assert run_pgqueue("tenants", "weight", "acme", "--remove", *where).returncode == 0
    assert json.loads(run_pgqueue("tenants", "shares", "--json", *where).stdout)[0]["weight"] == 1
    assert_usage_error(run_pgqueue("tenants", "weight", "acme", *where), "WEIGHT")
    assert_usage_error(run_pgqueue("tenants", "weight", "acme", "0", *where), "weight=0.0")
