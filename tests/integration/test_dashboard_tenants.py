"""The dashboard's Tenants page and /metrics show each limit key's running, waiting and limit,
and each fairness key's share of its queue's starts against the share owed."""

from __future__ import annotations

import html
import re

import psycopg
import pytest

from pgqueue import Queue
from pgqueue.queries import query
from tests.apps.tasks import noop
from tests.integration.test_dashboard import TOKEN, Served

pytest.importorskip("prometheus_client", reason="/metrics needs pgqueue-py[metrics]")
from pgqueue.dashboard import create_app


def test_tenants_page_and_metrics_show_limits_and_fair_shares(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    queue.set_concurrency_limit("tenant:1", 1)
    queue.set_fairness_weight("b", 3)
    keyed = noop.with_options(limits=["tenant:1"], fairness_key="a")
    queue.enqueue_many([keyed.job() for _ in range(3)])
    queue.enqueue_many([noop.with_options(fairness_key="b").job() for _ in range(20)])
    params = {
        "queue": "default", "after_priority": -32768, "after_vtime": float("-inf"),
        "before_priority": 32767, "before_vtime": float("inf"),
        "limit": 8, "worker_id": 1, "now": None,
    }  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as conn:
        # a's first job runs, its second is parked and its third with it (tenant:1 is full);
        # b, three times a's weight, gets 6 of the 7 starts.
        conn.execute(query("job_claim_fair", schema), params)
    site = Served(create_app(dsn, schema=schema, token=TOKEN))
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        status, body, _ = site.request("/tenants", headers=auth)
        assert status == 200, body[:2000]
        row = re.search(r'<tr data-tenant="tenant:1">(.*?)</tr>', body)
        assert row is not None, body
        assert re.findall(r"<td>([^<]*)</td>", row.group(1)) == ["1", "1", "2"]
        shares = dict(re.findall(r'<tr data-fairness-key="(\w)">(.*?)</tr>', body))
        cells = {k: [html.unescape(c) for c in re.findall(r"<td>([^<]*)</td>", v)]
                 for k, v in shares.items()}  # fmt: skip
        # queue, key, weight, queued, running, started, received, owed
        assert cells["b"] == ["default", "b", "3", "14", "6", "6", "85.7%", "75.0%"]
        assert cells["a"][5:] == ["1", "14.3%", "25.0%"]
        status, text, _ = site.request("/metrics", headers=auth)
        assert status == 200
    finally:
        site.stop()
        queue.close()
    assert 'pgqueue_key_jobs{key="tenant:1",state="waiting"} 2.0' in text
    assert 'pgqueue_key_limit{key="tenant:1"} 1.0' in text
    assert 'pgqueue_fair_share{key="b",kind="owed",queue="default"} 0.75' in text
    assert 'pgqueue_fair_share{key="a",kind="received",queue="default"}' in text
