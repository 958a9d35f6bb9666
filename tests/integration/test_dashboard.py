"""The dashboard over real HTTP (uvicorn) on real PostgreSQL: least-privilege roles, a mount
inside a host application with its own auth, bulk actions, the CSRF guard and /metrics.
The browser's view of it is tests/acceptance/test_dashboard_browser.py."""

from __future__ import annotations

import asyncio
import html
import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgqueue import Chain, JobContext, Queue, chain, chord, group
from pgqueue.migrate import grant_role
from pgqueue.models import RelayState
from pgqueue.testing import drain
from pgqueue.worker.scheduler import Scheduler
from tests.apps.tasks import always_fails, needs_file, noop, wf_collect, wf_step
from tests.apps.tasks import queue as app_queue
from tests.conftest import ROOT, count, env_without_dsn, free_port, wait_until

pytest.importorskip("starlette", reason="the dashboard needs pgqueue-py[dashboard]")
uvicorn = pytest.importorskip("uvicorn", reason="the dashboard needs pgqueue-py[dashboard]")
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from pgqueue.dashboard import create_app  # noqa: E402
from pgqueue.dashboard.views import Views  # noqa: E402

TOKEN = "a-token-of-the-integration-tests"


class Served:
    """An ASGI app served by uvicorn in a thread, and a client with its own cookie jar."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, what="uvicorn started")
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def request(
        self, path: str, form: dict[str, str] | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, str, str]:
        """(status, body, final URL), following redirects."""
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, headers=headers or {}
        )
        try:
            with self.opener.open(req, timeout=30) as reply:
                return reply.status, reply.read().decode(), reply.url
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(), exc.url

    def csrf(self, page: str, headers: dict[str, str] | None = None) -> str:
        """The CSRF token of `page`'s forms (its cookie is in the jar from then on)."""
        status, body, _ = self.request(page, headers=headers)
        assert status == 200, body
        found = re.search(r'name="csrf" value="([^"]+)"', body)
        assert found, body
        return found.group(1)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        board = getattr(self.app.state, "dashboard", None)
        if board is not None:
            board.close()


def note_of(body: str) -> str:
    found = re.search(r'data-testid="note">([^<]*)<', body)
    return found.group(1) if found else ""


@pytest.fixture
def roles(dsn: str, schema: str) -> Iterator[tuple[str, str]]:
    """DSNs of a role granted `read` and one granted `operator`."""
    names = [f"pgq_r_{uuid.uuid4().hex[:8]}", f"pgq_o_{uuid.uuid4().hex[:8]}"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role in names:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        grant_role(conn, schema, names[0], "read")
        grant_role(conn, schema, names[1], "operator")
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    yield tuple(psycopg.conninfo.make_conninfo("", **(info | {"user": r})) for r in names)  # type: ignore[misc]
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role in names:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def failed_jobs(queue: Queue, dsn: str, n: int) -> list[int]:
    ids = [int(i) for i in queue.enqueue_many([always_fails.job(note=f"n{i}") for i in range(n)])]
    drain(app_queue, dsn=dsn, schema=queue.schema)
    return ids


def test_pages_read_with_the_read_role_and_actions_run_with_the_operator_role(
    dsn: str, schema: str, roles: tuple[str, str]
) -> None:
    read_dsn, operator_dsn = roles
    queue = Queue(dsn, schema=schema)
    [failed] = failed_jobs(queue, dsn, 1)
    queue.enqueue(noop.with_options(queue="later").job())
    site = Served(
        create_app(
            read_dsn, schema=schema, allow_actions=True, token=TOKEN, actions_dsn=operator_dsn
        )
    )
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        for page in ("/", "/jobs", f"/jobs/{failed}", "/workers", "/tenants", "/recurring",
                     "/health", "/api/series", "/metrics"):  # fmt: skip
            status, body, _ = site.request(page, headers=auth)
            assert status == 200, (page, body[:2000])
        csrf = site.csrf("/", headers=auth)

        def act(path: str, **form: str) -> str:
            status, body, _ = site.request(path, {"csrf": csrf, **form}, headers=auth)
            assert status == 200, body[:2000]
            return note_of(body)

        assert "retried as job" in act(f"/jobs/{failed}/retry", back="/")
        assert "paused" in act("/queues/later/pause", back="/")
        assert queue.paused_queues()[0].queue == "later"
        assert "resumed" in act("/queues/later/resume", back="/")
        assert "at most 2 running" in act("/tenants", key="tenant-9", max_running="2")
        limits = {limit.key: limit.max_running for limit in queue.concurrency_limits()}
        assert limits["tenant-9"] == 2
        [later] = queue.list_jobs(queue="later").jobs
        assert "cancelled" in act(f"/jobs/{later.id}/cancel", back="/")
    finally:
        site.stop()
    # Actions with the read role are refused by the database, and the page says what to grant.
    readonly = Served(create_app(read_dsn, schema=schema, allow_actions=True, token=TOKEN))
    try:
        csrf = readonly.csrf("/", headers=auth)
        status, body, _ = readonly.request(
            "/queues/later/pause", {"csrf": csrf, "back": "/"}, headers=auth
        )
        assert status == 200
        assert "--kind operator" in note_of(body) and "permission denied" in note_of(body)
        assert queue.paused_queues() == []
    finally:
        readonly.stop()
    queue.close()


def test_mounted_in_a_host_application_it_keeps_its_prefix_and_uses_the_hosts_auth(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    [failed] = failed_jobs(queue, dsn, 1)
    dashboard = create_app(
        dsn,
        schema=schema,
        allow_actions=True,
        authorize=lambda request: request.headers.get("x-user") == "ops",
    )
    host = Starlette(routes=[Mount("/ops/queue", app=dashboard)])
    site = Served(host)
    ops = {"x-user": "ops"}
    try:
        status, body, _ = site.request("/ops/queue/jobs", headers=ops)
        assert status == 200
        assert f'href="http://127.0.0.1:{site.port}/ops/queue/jobs/{failed}"' in body
        assert site.request("/ops/queue/static/dashboard.js")[0] == 200
        assert site.request("/ops/queue/jobs", headers={"x-user": "someone"})[0] == 401
        csrf = site.csrf(f"/ops/queue/jobs/{failed}", headers=ops)
        status, body, url = site.request(
            f"/ops/queue/jobs/{failed}/retry",
            {"csrf": csrf, "back": f"/ops/queue/jobs/{failed}"},
            headers=ops,
        )
        assert "retried as job" in note_of(body)
        assert urllib.parse.urlsplit(url).path == f"/ops/queue/jobs/{failed}"
        # A redirect elsewhere is not followed: the action lands on the dashboard's front.
        csrf = site.csrf("/ops/queue/", headers=ops)
        status, body, url = site.request(
            "/ops/queue/queues/x/pause", {"csrf": csrf, "back": "//evil.example/"}, headers=ops
        )
        assert urllib.parse.urlsplit(url).netloc == f"127.0.0.1:{site.port}"
    finally:
        site.stop()
        dashboard.state.dashboard.close()
    queue.close()


def test_a_bulk_retry_retries_only_what_the_filter_selects(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    failed = failed_jobs(queue, dsn, 5)
    queue.enqueue_many([noop.with_options(queue="idle").job() for _ in range(3)])
    site = Served(create_app(dsn, schema=schema, allow_actions=True, token=TOKEN))
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        csrf = site.csrf("/jobs", headers=auth)
        _, body, _ = site.request(
            "/jobs/bulk",
            {"csrf": csrf, "action": "retry", "task": "always_fails", "back": "/jobs"},
            headers=auth,
        )
        assert note_of(body) == "retry: 5 jobs, 0 refused"
        retried = queue.list_jobs(task="always_fails", status="queued").jobs
        assert sorted(j.retry_of or 0 for j in retried) == failed
        assert count_queued(queue, "idle") == 3  # untouched: not selected
        _, body, _ = site.request(
            "/jobs/bulk",
            {"csrf": csrf, "action": "cancel", "queue": "idle", "back": "/jobs"},
            headers=auth,
        )
        assert note_of(body) == "cancel: 3 jobs, 0 refused"
        assert count_queued(queue, "idle") == 0
        assert len(queue.list_jobs(task="always_fails", status="queued").jobs) == 5
    finally:
        site.stop()
    queue.close()


def count_queued(queue: Queue, name: str) -> int:
    return len(queue.list_jobs(queue=name, status="queued").jobs)


def test_an_action_without_its_pages_csrf_token_changes_nothing(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    [failed] = failed_jobs(queue, dsn, 1)
    site = Served(create_app(dsn, schema=schema, allow_actions=True, token=TOKEN))
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        site.csrf("/tenants", headers=auth)  # the browser has a CSRF cookie ...
        status, body, _ = site.request(f"/jobs/{failed}/retry", {"csrf": "forged"}, headers=auth)
        assert status == 403 and "another site" in body  # ... but the form is not the page's
        csrf = site.csrf("/tenants", headers=auth)
        other_site = auth | {"origin": "http://evil.example"}
        status, body, _ = site.request(f"/jobs/{failed}/retry", {"csrf": csrf}, headers=other_site)
        assert status == 403
        assert site.request(f"/jobs/{failed}/retry", {"csrf": csrf})[0] == 401  # no token
    finally:
        site.stop()
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert count(conn, schema, "jobs") == 0
    queue.close()


def test_metrics_of_the_dashboard_read_the_queues_at_scrape_time(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    queue.enqueue_many([noop.with_options(queue="mail").job() for _ in range(4)])
    failed_jobs(queue, dsn, 2)
    site = Served(create_app(dsn, schema=schema, token=TOKEN))
    try:
        assert site.request("/metrics")[0] == 401
        status, body, _ = site.request("/metrics", headers={"authorization": f"Bearer {TOKEN}"})
    finally:
        site.stop()
    assert status == 200
    assert 'pgqueue_queue_jobs{queue="mail",status="queued"} 4.0' in body
    assert "pgqueue_database_up 1.0" in body
    assert re.search(r'pgqueue_queue_oldest_job_age_seconds\{queue="mail"\} [0-9.]+', body)
    queue.close()


def test_a_rare_filter_looks_through_a_window_of_ids_and_offers_to_look_further(
    dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgqueue.dashboard import pages

    monkeypatch.setattr(pages, "SEARCH_WINDOW", 20)
    queue = Queue(dsn, schema=schema)
    [old] = failed_jobs(queue, dsn, 1)
    queue.enqueue_many([noop.job() for _ in range(40)])  # newer jobs, none of them failed
    site = Served(create_app(dsn, schema=schema, token=TOKEN))
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        _, body, _ = site.request("/jobs?status=failed", headers=auth)
        assert f"/jobs/{old}" not in body
        assert "No more matches among jobs 22 to 41." in body
        found = re.search(r'data-testid="next-page" href="[^"?]*\?([^"]+)"', body)
        assert found is not None
        _, body, _ = site.request("/jobs?" + found.group(1).replace("&amp;", "&"), headers=auth)
        assert "No more matches among jobs 2 to 21." in body
        found = re.search(r'data-testid="next-page" href="[^"?]*\?([^"]+)"', body)
        assert found is not None
        _, body, _ = site.request("/jobs?" + found.group(1).replace("&amp;", "&"), headers=auth)
        assert f'href="http://127.0.0.1:{site.port}/jobs/{old}"' in body
        assert 'data-testid="next-page"' not in body  # the first id: nothing older
    finally:
        site.stop()
    queue.close()


def test_a_wrong_token_at_sign_in_is_refused_and_grants_nothing(dsn: str, schema: str) -> None:
    site = Served(create_app(dsn, schema=schema, token=TOKEN))
    browser = {"accept": "text/html"}
    try:
        csrf = site.csrf("/login")
        status, body, _ = site.request("/login", {"csrf": csrf, "token": "not-the-token"})
        assert status == 401 and "that token is not this dashboard&#39;s" in body
        _, _, url = site.request("/", headers=browser)
        assert urllib.parse.urlsplit(url).path == "/login"  # still signed out
        status, _, url = site.request("/login", {"csrf": csrf, "token": TOKEN})
        assert status == 200 and urllib.parse.urlsplit(url).path == "/"
        assert site.request("/workers", headers=browser)[0] == 200  # the cookie signs in
    finally:
        site.stop()


def test_a_schema_never_migrated_gets_pages_that_say_so_not_tracebacks(dsn: str) -> None:
    site = Served(create_app(dsn, schema="never_migrated_here"))
    try:
        status, body, _ = site.request("/")
        assert status == 500 and "pgqueue migrate" in body and "Traceback" not in body
        for page in ("/jobs", "/jobs/1", "/workers", "/tenants", "/recurring", "/health"):
            status, body, _ = site.request(page)
            assert status == 500 and "pgqueue migrate" in body, (page, body[-500:])
        status, body, _ = site.request("/api/series")
        assert status == 503 and "pgqueue migrate" in body
        status, body, _ = site.request("/metrics")
        assert status == 200 and "pgqueue_database_up 0.0" in body
    finally:
        site.stop()


# -- what each page draws, on real data ---------------------------------------------------------

REDIS_URL = os.environ.get("PGQUEUE_TEST_REDIS", "redis://127.0.0.1:6379/0")


def relay_process(dsn: str, schema: str, folder: Path, name: str) -> Any:
    """`pgqueue relay tests.apps.relay_app:relay` as a real process (its sinks see no message)."""
    env = env_without_dsn({"RELAY_FILE": str(folder / f"{name}.jsonl"), "REDIS_URL": REDIS_URL})
    with open(folder / f"{name}.log", "a") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "relay", "tests.apps.relay_app:relay",
             "--dsn", dsn, "--schema", schema],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


def relays_shown(body: str) -> dict[str, str]:
    """The health page's relays: {name: 'leading' or 'standing by'}."""
    return dict(re.findall(r'data-relay="([^"]+)">[^<(]*\(([a-z ]+)\)<', body))


def test_the_health_page_names_the_leading_relay_and_the_one_standing_by(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    Queue(dsn, schema=schema).migrate()
    first = relay_process(dsn, schema, tmp_path, "first")
    site = Served(create_app(dsn, schema=schema))
    procs = [first]
    try:
        wait_until(lambda: "leading" in relays_shown(site.request("/health")[1]).values())
        procs.append(relay_process(dsn, schema, tmp_path, "second"))
        wait_until(lambda: len(relays_shown(site.request("/health")[1])) == 2, what="two relays")
        body = site.request("/health")[1]
        assert "no transaction has held the horizon for 5 minutes or more" in body
        shown = relays_shown(body)
        assert shown == {
            f"{socket.gethostname()}:{first.pid}": "leading",
            f"{socket.gethostname()}:{procs[1].pid}": "standing by",
        }
    finally:
        site.stop()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def submit_buttons(body: str) -> list[str]:
    """The submit buttons of the page's POST forms (its actions), as written."""
    forms = re.findall(r'<form method="post".*?</form>', body, re.DOTALL)
    return [b for form in forms for b in re.findall(r"<button[^>]*>[^<]*</button>", form)]


def test_a_read_only_dashboard_draws_every_action_disabled_and_says_why(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    [failed] = failed_jobs(queue, dsn, 1)
    live = queue.enqueue(noop.with_options(queue="later").job())
    pages = ("/", "/jobs", f"/jobs/{failed}", f"/jobs/{int(live)}", "/tenants")
    readonly = Served(create_app(dsn, schema=schema))
    try:
        for page in pages:
            buttons = submit_buttons(readonly.request(page)[1])
            assert buttons, page  # each of these pages offers an action ...
            for button in buttons:  # ... that a read-only viewer cannot use, and is told why
                assert " disabled " in button, (page, button)
                assert 'title="Read-only: this dashboard was started without --allow-actions"' in (
                    button
                )
        # The server refuses the action anyway, whatever the page drew.
        csrf = readonly.csrf("/tenants")
        status, body, _ = readonly.request(f"/jobs/{failed}/retry", {"csrf": csrf, "back": "/"})
        assert status == 403 and "actions are off" in body
    finally:
        readonly.stop()
    acting = Served(create_app(dsn, schema=schema, allow_actions=True, token=TOKEN))
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        for page in pages:
            buttons = submit_buttons(acting.request(page, headers=auth)[1])
            assert buttons and not [b for b in buttons if "disabled" in b], page
    finally:
        acting.stop()
    queue.close()


def test_recurring_schedules_read_as_durations_and_cron_expressions_as_written(
    dsn: str, schema: str
) -> None:
    app = Queue(dsn, schema=schema)
    app.migrate()
    schedules: dict[str, dict[str, Any]] = {
        "two-seconds": {"every": timedelta(seconds=2)},
        "five-minutes": {"every": timedelta(minutes=5)},
        "ninety-minutes": {"every": timedelta(hours=1, minutes=30)},
        "a-day-and-a-second": {"every": timedelta(days=1, seconds=1)},
        "quarterly": {"cron": "*/15 * * * *"},
        "paris-mornings": {"cron": "0 8 * * 1-5", "timezone": "Europe/Paris"},
    }
    for name, schedule in schedules.items():
        app.periodic(noop, name=name, **schedule)

    async def record() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await Scheduler(app.periodics, schema, worker_id=1).run_pass(conn)

    asyncio.run(record())
    site = Served(create_app(dsn, schema=schema))
    try:
        status, body, _ = site.request("/recurring")
    finally:
        site.stop()
    assert status == 200
    shown = dict(re.findall(r"<tr><td>([^<]+)</td><td>noop</td><td[^>]*>([^<]+)</td>", body))
    assert shown == {
        "two-seconds": "every 2 seconds",
        "five-minutes": "every 5 minutes",
        "ninety-minutes": "every 1 hour 30 minutes",
        "a-day-and-a-second": "every 1 day 1 second",
        "quarterly": "every 15 minutes",
        "paris-mornings": "weekdays at 08:00 Europe/Paris",
    }
    assert "PT" not in body
    app.close()


def test_a_template_naming_what_its_data_lacks_fails_instead_of_drawing_nothing() -> None:
    import jinja2

    board = create_app("postgresql://unused", schema="unused").state.dashboard
    views = Views(board)
    template = views.templates.env.from_string("{{ 'leading' if r.is_leader else 'standing by' }}")
    with pytest.raises(jinja2.UndefinedError, match="is_leader"):
        template.render(r=RelayState(name="h:1", hostname="h", pid=1, leading=True,
                                     started_at=datetime.now(timezone.utc)))  # fmt: skip


# -- the workflow page --------------------------------------------------------------------------

ATTACK = '<script>window.pwned = true</script><img src=x onerror="window.pwned = true">'


def sample_flow(folder: Path) -> Chain:
    """chain(chord(group(a, b, held), collect), step): a and b succeed when run (a's result
    holds markup, b's is long); `held` waits on a queue no worker serves, so `collect` and
    `step` stay blocked and their edges stay in the database."""
    (folder / "a.txt").write_text(ATTACK)
    (folder / "b.txt").write_text("x" * 5000)
    held = needs_file.with_options(queue="held")
    members = group(
        needs_file.job(str(folder / "a.txt")),
        needs_file.job(str(folder / "b.txt")),
        held.job(str(folder / "held.txt")),
    )
    return chain(chord(members, wf_collect.s()), wf_step.s())


def sample_workflow(queue: Queue, dsn: str, folder: Path) -> dict[str, int]:
    """sample_flow stored and its runnable jobs run; the ids of the workflow and its jobs."""
    stored = queue.enqueue_workflow(sample_flow(folder))
    drain(app_queue, dsn=dsn, schema=queue.schema)
    names = ("a", "b", "held", "collect", "step")
    return {"workflow": stored.id} | dict(zip(names, stored.job_ids, strict=True))


def row_of(body: str, job_id: int) -> str:
    found = re.search(rf'<tr data-job="{job_id}">(.*?)</tr>', body, re.DOTALL)
    assert found, f"no row of job {job_id}"
    return found.group(1)


def first(pattern: str, text: str) -> str:
    found = re.search(pattern, text, re.DOTALL)
    assert found, (pattern, text)
    return found.group(1)


def cell(row: str, testid: str) -> str:
    found = re.search(rf'data-testid="{testid}">(.*?)</td>', row, re.DOTALL)
    assert found, (testid, row)
    return found.group(1)


def test_the_workflow_page_shows_members_states_results_and_what_waits_for_what(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    ids = sample_workflow(queue, dsn, tmp_path)
    site = Served(create_app(dsn, schema=schema))
    try:
        status, body, _ = site.request(f"/workflows/{ids['workflow']}")
        # Every job of the workflow links here: its page, and the jobs list.
        _, job_page, _ = site.request(f"/jobs/{ids['collect']}")
        _, jobs_list, _ = site.request("/jobs")
    finally:
        site.stop()
    assert status == 200
    link = f'href="http://127.0.0.1:{site.port}/workflows/{ids["workflow"]}"'
    assert link in job_page
    assert jobs_list.count(link) == 5
    counts = re.sub(r"<[^>]+>", "", first(r'data-testid="counts">(.*?)</p>', body))
    assert counts == "blocked 2 · queued 1 · succeeded 2"
    statuses = {
        name: first(r'class="status status-([a-z]+)"', row_of(body, ids[name]))
        for name in ("a", "b", "held", "collect", "step")
    }
    assert statuses == {"a": "succeeded", "b": "succeeded", "held": "queued",
                        "collect": "blocked", "step": "blocked"}  # fmt: skip
    # The edges: collect waits for the group, step for collect; each member names who waits.
    waits = cell(row_of(body, ids["collect"]), "waits-for")
    edge = r'data-edge="(\d+)">\d+</a> <span class="edge-state">\(([a-z ]+)\)'
    assert re.findall(edge, waits) == [
        (str(ids["a"]), "succeeded"),
        (str(ids["b"]), "succeeded"),
        (str(ids["held"]), "not finished"),
    ]
    assert re.findall(r'data-edge="(\d+)"', cell(row_of(body, ids["step"]), "waits-for")) == [
        str(ids["collect"])
    ]
    for member in ("a", "b", "held"):
        waited = cell(row_of(body, ids[member]), "waited-on-by")
        assert re.findall(r'data-edge="(\d+)"', waited) == [str(ids["collect"])]
    # Results are escaped, and a long one is cut and says how long it is.
    result_a = row_of(body, ids["a"])
    assert "<script>" not in body.split("<body>")[1] and "&lt;script&gt;" in result_a
    result_b = html.unescape(first(r'data-testid="result">([^<]*)<', row_of(body, ids["b"])))
    assert result_b == '"' + "x" * 299 + "… (5,002 characters)"
    queue.close()


def test_a_large_workflow_is_listed_a_page_at_a_time_with_its_edges_bounded(
    dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    members = [noop.with_options(queue="held").job() for _ in range(250)]
    stored = queue.enqueue_workflow(chord(group(members), wf_collect.s()))
    callback = stored.job_ids[-1]
    site = Served(create_app(dsn, schema=schema))
    seen: list[int] = []
    try:
        path = f"/workflows/{stored.id}"
        while True:
            status, body, _ = site.request(path)
            assert status == 200
            seen += [int(i) for i in re.findall(r'<tr data-job="(\d+)">', body)]
            found = re.search(r'data-testid="next-page" href="[^"?]*\?([^"]+)"', body)
            if found is None:
                break
            path = f"/workflows/{stored.id}?{found.group(1)}"
        callback_row = row_of(body, callback)  # on the last page
    finally:
        site.stop()
    assert seen == stored.job_ids  # every job once, in id order, 100 a page
    waits = cell(callback_row, "waits-for")
    assert len(re.findall(r"data-edge=", waits)) == 20 and waits.endswith(" and more")
    queue.close()


def test_an_unknown_workflow_or_a_bad_page_is_refused_with_a_clear_message(
    dsn: str, schema: str
) -> None:
    Queue(dsn, schema=schema).migrate()
    site = Served(create_app(dsn, schema=schema))
    try:
        status, body, _ = site.request("/workflows/424242")
        assert status == 404
        assert "no workflow 424242: no job, live or finished, belongs to it" in body
        status, body, _ = site.request("/workflows/1?after=%3Cb%3E")
        assert status == 400 and "after &#39;&lt;b&gt;&#39; is not a job id" in body
        too_large = str(2**63)
        assert site.request(f"/workflows/{too_large}")[0] == 404
        status, body, _ = site.request(f"/workflows/1?after={too_large}")
        assert status == 400 and f"after &#39;{too_large}&#39; is not a job id" in body
    finally:
        site.stop()


# -- durable jobs -------------------------------------------------------------------------------


def durable_jobs(queue: Queue, dsn: str) -> dict[str, int]:
    """A job asleep for a day, one parked for a signal, one finished with its steps (one
    step's result holds markup, another's is long), and one merely scheduled."""

    @queue.task(name="seen.sleeper", queue="seen")
    def sleeper(ctx: JobContext) -> None:
        ctx.step("greet", lambda: ATTACK)
        ctx.sleep(timedelta(days=1), name="a day")

    @queue.task(name="seen.waiter", queue="seen")
    def waiter(ctx: JobContext) -> None:
        ctx.wait_for_signal("order-<9>", timeout=timedelta(hours=2))

    @queue.task(name="seen.done", queue="seen")
    def done(ctx: JobContext) -> str:
        ctx.step("long", lambda: {"text": "y" * 500})
        return "ok"

    ids = {
        "sleeper": sleeper.enqueue(),
        "waiter": waiter.enqueue(),
        "done": done.enqueue(),
        "later": done.with_options(delay=timedelta(days=1)).enqueue(),
    }
    drain(queue, dsn=dsn, queues=["seen"])  # a queue the browser tests' worker leaves alone
    return {name: int(i) for name, i in ids.items()}


def test_a_durable_job_s_page_lists_its_steps_and_what_it_waits_for(dsn: str, schema: str) -> None:
    queue = Queue(dsn, schema=schema)
    ids = durable_jobs(queue, dsn)
    site = Served(create_app(dsn, schema=schema, token=TOKEN))
    auth = {"authorization": f"Bearer {TOKEN}"}
    try:
        pages = {name: site.request(f"/jobs/{i}", headers=auth) for name, i in ids.items()}
        _, listed, _ = site.request("/jobs", headers=auth)
    finally:
        site.stop()
    assert all(status == 200 for status, _, _ in pages.values())
    asleep = pages["sleeper"][1]
    assert 'data-testid="sleeping"' in asleep and 'data-testid="waiting"' not in asleep
    assert "<dt>waited</dt><dd>-</dd>" in asleep  # not a negative wait: it runs again later
    steps = first(r'<table data-testid="steps">(.*?)</table>', asleep)
    assert "greet" in steps and "recorded" in steps and "a day" in steps and ">sleep<" in steps
    assert ATTACK not in asleep and html.escape(ATTACK, quote=False)[:20] in asleep
    parked = pages["waiter"][1]
    waiting = first(r'data-testid="waiting">(.*?)</dd>', parked)
    assert "order-&lt;9&gt;" in waiting and "until" in waiting
    assert 'data-testid="steps"' not in parked  # nothing recorded yet
    finished = pages["done"][1]  # in history: its steps stay with it
    assert 'data-testid="sleeping"' not in finished
    whole = first(r'<details data-testid="step-result">(.*?)</details>', finished)
    assert "…" in first(r"<summary>(.*?)</summary>", whole) and "y" * 500 in whole
    assert 'data-testid="steps"' not in pages["later"][1]
    assert 'data-testid="sleeping-badge"' in row_of(listed, ids["sleeper"])
    assert 'data-testid="waiting-badge"' in row_of(listed, ids["waiter"])
    assert "badge" not in row_of(listed, ids["later"])  # scheduled, not durable
    assert "badge" not in row_of(listed, ids["done"])
