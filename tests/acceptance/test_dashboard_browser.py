"""The dashboard in a real browser: headless Chromium (Debian's package) driven by Playwright,
against `pgqueue dashboard` and `pgqueue worker` running as real processes.

With PGQUEUE_SCREENSHOTS set to a folder, each page's screenshot is saved there: the dashboard
how-to's pictures come from `PGQUEUE_SCREENSHOTS=docs/screenshots pytest -k browser`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgqueue import Queue
from pgqueue.worker.scheduler import Scheduler
from tests import chromium
from tests.apps.tasks import always_fails, needs_file, noop, sleepy
from tests.conftest import (
    ROOT,
    count,
    env_without_dsn,
    free_port,
    stop_worker_processes,
    wait_until,
    worker_process,
)
from tests.integration.test_dashboard import (
    ATTACK,
    durable_jobs,
    relay_process,
    relays_shown,
    sample_flow,
)

playwright_api = chromium.require()
TOKEN = "a-token-for-the-browser-tests"


def dashboard_process(dsn: str, schema: str, port: int, *args: str, log: Path) -> Any:
    """`pgqueue dashboard` as a real process, answering once this returns."""
    env = env_without_dsn({"PGQUEUE_DASHBOARD_TOKEN": TOKEN})
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgqueue", "dashboard", "--dsn", dsn, "--schema", schema,
             "--port", str(port), *args],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def answering() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/login", timeout=2).close()
            return True
        except (urllib.error.URLError, ConnectionError):
            return False

    wait_until(answering, what="the dashboard answering")
    return proc


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.launched(playwright_api)


@pytest.fixture
def site(dsn: str, schema: str, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A schema with a live worker on `default` and `mail`, and a dashboard with actions on,
    whose browser page is signed in with the token."""
    Queue(dsn, schema=schema).migrate()
    port = free_port()
    dash = dashboard_process(
        dsn, schema, port, "--allow-actions", "--horizon-warning", "2s", log=tmp_path / "dash.log"
    )
    worker = worker_process(
        dsn, schema, "--queues", "default,mail", "--poll-interval", "0.2",
        "--heartbeat-interval", "1", log=tmp_path / "worker.log",
    )  # fmt: skip
    try:
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "worker": worker}
    finally:
        stop_worker_processes([worker])
        dash.terminate()
        dash.wait(30)


@pytest.fixture
def page(browser: Any, site: dict[str, Any]) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    tab = context.new_page()
    tab.goto(site["url"] + "/login")
    tab.fill("input[name=token]", TOKEN)
    tab.click("button[type=submit]")
    tab.wait_for_url(site["url"] + "/")
    yield tab
    context.close()


def samples(tab: Any) -> int:
    """How many samples the queues page's charts have drawn (the page's CSP forbids the
    evaluated predicates of wait_for_function)."""
    return int(tab.get_attribute("section.charts", "data-samples") or 0)


def shoot(tab: Any, name: str) -> None:
    folder = os.environ.get("PGQUEUE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)


def test_each_page_loads_with_live_workers_and_the_charts_draw(
    page: Any, site: dict[str, Any], dsn: str, schema: str, request: pytest.FixtureRequest
) -> None:
    queue = Queue(dsn, schema=schema)
    # A long transaction elsewhere: the health page names it.
    holder = psycopg.connect(dsn, application_name="nightly-report")
    request.addfinalizer(holder.close)
    holder.execute("SELECT txid_current()")
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.enqueue_many([noop.job() for _ in range(40)], conn=conn)
        queue.enqueue_many([sleepy.job(8) for _ in range(2)], conn=conn)
        queue.enqueue(always_fails.job(note="a bad address"), conn=conn)
        queue.enqueue(noop.with_options(queue="reports").job(), conn=conn)  # nobody serves it
        queue.set_concurrency_limit("tenant-7", 3, conn=conn)
        wait_until(lambda: count(conn, schema, "jobs", "status = 'running'") == 2)
    page.goto(site["url"] + "/")
    for batch in range(4):  # work arriving while the charts sample, one sample apart
        queue.enqueue_many([noop.job() for _ in range(20 * (batch + 1))])
        wanted = batch + 2
        wait_until(lambda: samples(page) >= wanted, what="the charts' next sample")  # noqa: B023
    # Each chart has a line; claim times arrive with the worker's heartbeats.
    for chart in ("throughput", "depth", "claim"):
        page.wait_for_selector(f"svg#chart-{chart} polyline[points*=',']", state="attached")
    # Each chart has a time axis, labelled in UTC clock times that run left to right.
    for chart in ("throughput", "depth", "claim"):
        times = page.locator(f"svg#chart-{chart} text.time-label").all_text_contents()
        assert len(times) >= 3, times
        assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in times), times
        assert times == sorted(times) and times[0] != times[-1], times
        values = page.locator(f"svg#chart-{chart} text.value-label").all_text_contents()
        assert values[-1] == "0" and float(values[0]) > 0, values
    page.reload()  # the table as it is now; the charts keep their samples (the server's)
    page.wait_for_selector("svg#chart-claim polyline[points*=',']", state="attached")
    rows = page.locator("table[data-testid=queues] tbody tr")
    assert rows.filter(has_text="reports").count() == 1
    assert "1" in rows.filter(has_text="reports").inner_text()  # one queued, none running
    shoot(page, "queues")
    page.click("nav >> text=Workers")
    worker_row = page.locator("table[data-testid=workers] tbody tr").first
    assert str(site["worker"].pid) in worker_row.inner_text()
    shoot(page, "workers")
    page.click("nav >> text=Jobs")
    assert page.locator("table[data-testid=jobs] tbody tr").count() == 50  # one page
    assert page.locator("[data-testid=next-page]").is_visible()
    shoot(page, "jobs")
    page.click("nav >> text=Tenants")
    assert "tenant-7" in page.locator("table[data-testid=tenants]").inner_text()
    shoot(page, "tenants")
    page.click("nav >> text=Recurring")
    assert page.locator("table[data-testid=recurring]").is_visible()
    shoot(page, "recurring")
    page.click("nav >> text=Health")
    verdict = page.locator("[data-testid=verdict]").inner_text()
    assert verdict.startswith("Watchdog: held") and "nightly-report" in verdict
    assert "nightly-report" in page.locator("table[data-testid=holders]").inner_text()
    shoot(page, "health")


def test_filtering_jobs_by_task_and_status(
    page: Any, site: dict[str, Any], dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.enqueue_many([noop.job() for _ in range(5)], conn=conn)
        queue.enqueue_many([always_fails.job(note=f"n{i}") for i in range(3)], conn=conn)
        wait_until(lambda: count(conn, schema, "job_history") == 8)
    page.goto(site["url"] + "/jobs")
    page.fill("input[name=task]", "always_fails")
    page.fill("input[name=status]", "failed")
    page.click("form[data-testid=filters] button[type=submit]")
    rows = page.locator("table[data-testid=jobs] tbody tr")
    assert rows.count() == 3
    assert all("always_fails" in rows.nth(i).inner_text() for i in range(3))
    page.fill("input[name=status]", "nonsense")
    page.click("form[data-testid=filters] button[type=submit]")
    assert "status 'nonsense'" in page.locator("[data-testid=problem]").inner_text()


def test_a_failed_job_shows_its_traceback_and_a_retry_from_the_page_succeeds(
    page: Any, site: dict[str, Any], dsn: str, schema: str, tmp_path: Path
) -> None:
    needed = tmp_path / "address.txt"
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = queue.enqueue(needs_file.job(str(needed)), conn=conn)
        wait_until(lambda: count(conn, schema, "job_history", "status = 'failed'") == 1)
    page.goto(site["url"] + f"/jobs/{int(job)}")
    traceback = page.locator("[data-testid=traceback]").inner_text()
    assert "FileNotFoundError" in traceback and "read_text" in traceback
    shoot(page, "job")
    needed.write_text("the fix")
    page.click("form[action$='/retry'] button")
    note = page.locator("[data-testid=note]").inner_text()
    assert f"job {int(job)} retried as job" in note
    retried = int(note.rsplit(" ", 1)[1])
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = f"id = {retried} AND status = 'succeeded'"
        wait_until(lambda: count(conn, schema, "job_history", done) == 1, what="the retry done")
    page.goto(site["url"] + f"/jobs/{retried}")
    assert "succeeded" in page.locator("h1").inner_text()
    assert '"the fix"' in page.locator("[data-testid=result]").inner_text()


def test_a_paused_queue_starts_no_job_until_resumed(
    page: Any, site: dict[str, Any], dsn: str, schema: str
) -> None:
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        queue.enqueue(noop.with_options(queue="mail").job(), conn=conn)  # the queue appears
        wait_until(lambda: count(conn, schema, "job_history") == 1)
        page.goto(site["url"] + "/")
        page.locator("tr[data-queue=mail] button", has_text="Pause").click()
        assert "queue mail paused" in page.locator("[data-testid=note]").inner_text()
        assert "paused" in page.locator("tr[data-queue=mail]").inner_text()
        queue.enqueue_many([noop.with_options(queue="mail").job() for _ in range(5)], conn=conn)
        # The worker serves mail and polls every 0.2 s: ten polls, and nothing starts.
        time.sleep(2)
        assert count(conn, schema, "jobs", "queue = 'mail' AND status = 'queued'") == 5
        assert count(conn, schema, "job_history") == 1
        page.goto(site["url"] + "/")
        page.locator("tr[data-queue=mail] button", has_text="Resume").click()
        assert "queue mail resumed" in page.locator("[data-testid=note]").inner_text()
        wait_until(lambda: count(conn, schema, "job_history") == 6, what="the 5 run")


def test_an_action_is_refused_without_auth_or_with_actions_off(
    browser: Any, page: Any, site: dict[str, Any], dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = queue.enqueue(always_fails.job(note="x"), conn=conn)
        wait_until(lambda: count(conn, schema, "job_history", "status = 'failed'") == 1)
        # A browser that never signed in sees no page, and a post of its own is refused.
        stranger = browser.new_context()
        tab = stranger.new_page()
        tab.goto(site["url"] + f"/jobs/{int(job)}")
        assert tab.url.endswith("/login")
        reply = tab.request.post(site["url"] + f"/jobs/{int(job)}/retry", form={"csrf": "guess"})
        assert reply.status == 401
        stranger.close()
        # Signed in, but a form without the page's CSRF token is refused too.
        retry = site["url"] + f"/jobs/{int(job)}/retry"
        forged = page.request.post(retry, form={"csrf": "guess"})
        assert forged.status == 403
        # A dashboard started without --allow-actions draws its actions disabled, saying why,
        # and refuses a post all the same.
        port = free_port()
        readonly = dashboard_process(dsn, schema, port, log=tmp_path / "readonly.log")
        why = "Read-only: this dashboard was started without --allow-actions"
        try:
            tab = browser.new_page()
            base = f"http://127.0.0.1:{port}"
            tab.goto(f"{base}/login")
            tab.fill("input[name=token]", TOKEN)
            tab.click("button[type=submit]")
            assert tab.locator("[data-testid=mode]").inner_text() == "read-only"
            tab.goto(f"{base}/jobs/{int(job)}")
            retry = tab.locator("form[action$='/retry'] button")
            assert retry.is_disabled() and retry.get_attribute("title") == why
            tab.goto(f"{base}/")
            pause = tab.locator("tr[data-queue=default] button", has_text="Pause")
            assert pause.is_disabled() and pause.get_attribute("title") == why
            tab.goto(f"{base}/jobs")
            for label in ("Retry failed and cancelled", "Cancel live"):
                bulk = tab.locator("form.bulk button", has_text=label)
                assert bulk.is_disabled() and bulk.get_attribute("title") == why
            csrf = tab.locator("form.bulk input[name=csrf]").get_attribute("value")
            reply = tab.request.post(f"{base}/jobs/{int(job)}/retry", form={"csrf": csrf or ""})
            assert reply.status == 403 and "actions are off" in reply.text()
            tab.close()
        finally:
            readonly.terminate()
            readonly.wait(30)
        assert count(conn, schema, "jobs") == 0  # no retry was enqueued by any of them


def test_a_job_whose_args_and_error_hold_script_tags_renders_them_as_text(
    page: Any, site: dict[str, Any], dsn: str, schema: str
) -> None:
    attack = '<script>window.pwned = true</script><img src=x onerror="window.pwned = true">'
    queue = Queue(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        job = queue.enqueue(always_fails.job(note=attack), conn=conn)
        wait_until(lambda: count(conn, schema, "job_history", "status = 'failed'") == 1)
    page.goto(site["url"] + f"/jobs/{int(job)}")
    assert json.dumps(attack) in page.locator("[data-testid=args]").inner_text()
    assert attack in page.locator("[data-testid=error] .error").first.inner_text()
    page.goto(site["url"] + "/jobs")
    assert page.evaluate("window.pwned === undefined")
    assert page.locator("script:not([src])").count() == 0
    page.goto(site["url"] + f"/jobs/{int(job)}")
    assert page.evaluate("window.pwned === undefined")


def test_the_health_page_names_the_leading_relay_and_the_one_standing_by(
    page: Any,
    site: dict[str, Any],
    dsn: str,
    schema: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    holder = psycopg.connect(dsn, application_name="nightly-report")  # for the screenshot
    request.addfinalizer(holder.close)
    holder.execute("SELECT txid_current()")
    relays = [relay_process(dsn, schema, tmp_path, "first")]
    try:
        health = site["url"] + "/health"
        wait_until(lambda: "leading" in relays_shown(page.request.get(health).text()).values())
        relays.append(relay_process(dsn, schema, tmp_path, "second"))
        wait_until(lambda: len(relays_shown(page.request.get(health).text())) == 2)
        page.goto(health)
        first, second = (f"[data-testid=relays] [data-relay$=':{p.pid}']" for p in relays)
        assert page.locator(first).inner_text().endswith("(leading)")
        assert page.locator(second).inner_text().endswith("(standing by)")
        shoot(page, "health")
    finally:
        for proc in relays:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def test_recurring_schedules_read_as_durations_and_cron_as_written(
    page: Any, site: dict[str, Any], dsn: str, schema: str
) -> None:
    app = Queue(dsn, schema=schema)
    app.periodic(noop, name="often", every=timedelta(seconds=2))
    app.periodic(noop, name="twice-a-shift", every=timedelta(hours=1, minutes=30))
    app.periodic(noop, name="quarterly", cron="*/15 * * * *")

    async def record() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await Scheduler(app.periodics, schema, worker_id=1).run_pass(conn)

    with ThreadPoolExecutor(1) as apart:  # Playwright's own loop runs in this thread
        apart.submit(asyncio.run, record()).result()
    page.goto(site["url"] + "/recurring")
    shown = {
        row.locator("td").first.inner_text(): row.locator("[data-testid=schedule]").inner_text()
        for row in page.locator("table[data-testid=recurring] tbody tr").all()
    }
    assert shown == {
        "often": "every 2 seconds",
        "twice-a-shift": "every 1 hour 30 minutes",
        "quarterly": "every 15 minutes",
    }
    shoot(page, "recurring")
    app.close()


def test_a_workflow_is_reached_from_its_jobs_and_shows_members_states_and_edges(
    page: Any, site: dict[str, Any], dsn: str, schema: str, tmp_path: Path
) -> None:
    queue = Queue(dsn, schema=schema)
    stored = queue.enqueue_workflow(sample_flow(tmp_path))
    a, b, held, collect, step = stored.job_ids
    with psycopg.connect(dsn, autocommit=True) as conn:
        done = f"id IN ({a}, {b}) AND status = 'succeeded'"
        wait_until(lambda: count(conn, schema, "job_history", done) == 2, what="a and b run")
    workflow_url = site["url"] + f"/workflows/{stored.id}"
    # From a job's page ...
    page.goto(site["url"] + f"/jobs/{collect}")
    page.click("[data-testid=facts] [data-testid=workflow-link]")
    page.wait_for_url(workflow_url)
    # ... and from the jobs list.
    page.goto(site["url"] + "/jobs")
    page.click(f"tr[data-job='{step}'] [data-testid=workflow-link]")
    page.wait_for_url(workflow_url)
    assert page.locator("h1").inner_text().startswith(f"Workflow {stored.id}")
    counts = page.locator("[data-testid=counts]").inner_text()
    assert counts == "blocked 2 · queued 1 · succeeded 2"
    states = {
        int(row.get_attribute("data-job")): row.locator(".status").inner_text()
        for row in page.locator("table[data-testid=members] tbody tr").all()
    }
    assert states == {a: "succeeded", b: "succeeded", held: "queued", collect: "blocked",
                      step: "blocked"}  # fmt: skip

    def edges(job: int, column: str) -> str:
        return str(page.locator(f"tr[data-job='{job}'] [data-testid={column}]").inner_text())

    assert edges(collect, "waits-for") == (
        f"{a} (succeeded), {b} (succeeded), {held} (not finished)"
    )
    assert edges(step, "waits-for") == f"{collect} (not finished)"
    assert [edges(j, "waited-on-by") for j in (a, b, held, collect)] == [str(collect)] * 3 + [
        str(step)
    ]
    # Results are text, never markup; a long one is cut and says its length.
    assert page.locator(f"tr[data-job='{a}'] [data-testid=result]").inner_text() == json.dumps(
        ATTACK
    )
    assert page.evaluate("window.pwned === undefined")
    long = page.locator(f"tr[data-job='{b}'] [data-testid=result]").inner_text()
    assert long.endswith("… (5,002 characters)") and len(long) < 400
    shoot(page, "workflow")
    # An edge leads to the job it names.
    page.click(f"tr[data-job='{collect}'] [data-testid=waits-for] a[data-edge='{held}']")
    page.wait_for_url(site["url"] + f"/jobs/{held}")
    queue.close()


def test_a_durable_job_s_steps_show_cut_and_open_whole_and_markup_stays_text(
    page: Any, site: dict[str, Any], dsn: str, schema: str
) -> None:
    with ThreadPoolExecutor(1) as apart:  # Playwright's own loop runs in this thread
        ids = apart.submit(durable_jobs, Queue(dsn, schema=schema), dsn).result()
    page.goto(site["url"] + f"/jobs/{ids['done']}")
    result = page.locator("[data-testid=step-result]")
    whole = result.locator("pre")
    assert not whole.is_visible()
    assert result.locator("summary").inner_text().endswith("…")
    result.locator("summary").click()
    assert "y" * 500 in whole.inner_text()
    page.goto(site["url"] + f"/jobs/{ids['sleeper']}")
    assert page.locator("[data-testid=sleeping]").is_visible()
    assert "window.pwned" in page.locator("[data-testid=steps]").inner_text()
    assert page.evaluate("window.pwned === undefined")
    shoot(page, "durable-job")
    page.goto(site["url"] + "/jobs")
    badge = page.locator(f"tr[data-job='{ids['waiter']}'] [data-testid=waiting-badge]")
    assert badge.inner_text() == "signal"
