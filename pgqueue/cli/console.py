"""How `pgqueue status`, `workers`, `watchdog` and `jobs` look in a terminal (rich tables).
No I/O but printing to the console it is given. Tables fit the terminal's width: headers are
short enough for 80 columns, and long cells wrap or are cut where a full view exists."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from pgqueue import health, words
from pgqueue.cli import recurring
from pgqueue.models import Job, JobPage, JobSteps, Workflow
from pgqueue.store.workers import WorkerRow


class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (`| head`): the command's entry point ends quietly, with the
        exit status every command gives then, instead of rich's own exit."""
        self.quiet = True
        raise BrokenPipeError


def make_console(**options: Any) -> Console:
    """A console for the command's output; `options` go to rich's Console."""
    # Query texts and application names are anyone's: print them as they are, not as markup.
    return _Console(**({"markup": False, "emoji": False} | options))


def print_status(console: Console, report: health.Status) -> None:
    if report.queues:
        console.print(f"queues in schema {report.schema_name}")
        console.print(_queue_table(console, report.queues))
        console.print(
            "waiting: held by a concurrency limit; blocked: waiting for the jobs they depend "
            "on; fail/h: failed in the last hour; done/m: succeeded in the last minute; "
            "oldest: the oldest queued job's wait"
        )
    else:
        console.print(f"schema {report.schema_name}: no live jobs, none finished in the last hour")
    t = report.jobs_table
    console.print("\ndatabase health", style="bold")
    console.print(
        f"{t.schema_name}.{t.table_name}: {t.n_dead_tup:,} dead rows, {t.n_live_tup:,} live; "
        f"last autovacuum {_when(t.last_autovacuum)}, last vacuum {_when(t.last_vacuum)}"
    )
    box = report.outbox
    if box.staged or box.dead:
        since = box.oldest_staged_at
        oldest = words.age(datetime.now(timezone.utc) - since) if since else "-"
        console.print(
            f"outbox: {box.staged:,} staged (oldest {oldest}), {box.dead:,} dead "
            "(pgqueue outbox --dead)"
        )
    for relay in report.relays:
        role = "publishing" if relay.leading else "standing by"
        error = f"; last error: {relay.last_error}" if relay.last_error else ""
        console.print(
            f"relay {relay.name} {role}: {relay.per_second:,.1f}/s lately, {relay.published:,} "
            f"published, {relay.refused:,} refused, {relay.failed:,} failed attempts{error}",
            markup=False,
        )
    if not any(h.kind == "session" for h in report.holders):
        console.print("no session holds back the xmin horizon")
    for kind, title in (
        ("session", "oldest sessions holding back the xmin horizon"),
        ("replication_slot", "replication slots holding back the xmin horizon"),
        ("prepared_xact", "prepared transactions holding back the xmin horizon"),
    ):
        holders = [h for h in report.holders if h.kind == kind]
        if holders:
            console.print(_holder_table(console, title, holders[:10]))
        if len(holders) > 10:
            console.print(f"... and {len(holders) - 10} more (see --json)")


def _queue_table(console: Console, queues: Sequence[health.QueueStats]) -> Table:
    """Per-queue counts that fit the console (80 columns and up): the counts keep their
    width, one space apart, and a queue name too long for what is left is cut with an
    ellipsis, never folded (`--json` has it whole)."""
    headers = ("queued", "sched", "running", "waiting", "blocked", "fail/h", "done/m", "oldest")
    rows = []
    for q in queues:
        counts = (q.queued, q.scheduled, q.running, q.waiting, q.blocked, q.failed_last_hour)
        cells = [f"{n:,}" for n in (*counts, q.succeeded_last_minute)]
        rows.append((q, [*cells, words.age(q.oldest_queued_age)]))
    widths = [max(len(h), *(len(cells[i]) for _, cells in rows)) for i, h in enumerate(headers)]
    room = max(console.width - sum(widths) - len(widths) - 1, 8)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0))
    table.add_column("queue", no_wrap=True, overflow="ellipsis", max_width=room)
    for name in headers:
        table.add_column(name, justify="right", no_wrap=True)
    for q, cells in rows:
        table.add_row(_cut(q.queue, room, " (paused)" if q.paused else ""), *cells)
    return table


def _cut(text: str, room: int, suffix: str = "") -> str:
    """`text` and `suffix` in `room` characters, `text` cut with an ellipsis if need be."""
    if len(text) + len(suffix) <= room:
        return text + suffix
    return text[: max(room - len(suffix) - 1, 1)] + "…" + suffix


def print_recurring(console: Console, found: Sequence[recurring.Recurring]) -> None:
    """Recurring jobs by name: task, schedule, next and last run, state. The times and the
    state keep their width; names, tasks and schedules share the rest of the console and are
    cut with an ellipsis where they must be (`--json` has them whole)."""
    if not found:
        console.print("no recurring jobs: none stored by a worker, none defined by an app given")
        return
    now = datetime.now(timezone.utc)
    headers = ("name", "task", "schedule", "next run", "last run", "state")
    rows = [
        (r.name, r.task, r.schedule, recurring.when(r.next_run, now),
         recurring.when(r.last_run, now), r.state)
        for r in found
    ]  # fmt: skip
    natural = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    gaps = 2 * (len(headers) - 1)
    shared = _share(natural[:3], console.width - sum(natural[3:]) - gaps)
    widths = [*shared, *natural[3:]]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for header, width in zip(headers, widths, strict=True):
        table.add_column(header, no_wrap=True, width=width)
    for row in rows:
        table.add_row(*(_cut(cell, width) for cell, width in zip(row, widths, strict=True)))
    console.print(table)


def _share(natural: Sequence[int], room: int) -> list[int]:
    """Widths for columns that want `natural` widths in `room`: the widest is cut first, a
    character at a time, so short columns stay whole; none goes below 4."""
    widths = list(natural)
    while sum(widths) > room and max(widths) > 4:
        widest = widths.index(max(widths))
        widths[widest] -= 1
    return widths


def print_workers(console: Console, workers: Sequence[WorkerRow]) -> None:
    """The live workers, newest first; one silent for long is dead and about to be rescued."""
    if not workers:
        console.print("no worker is registered")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("host", overflow="fold")
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("queues", overflow="fold")
    table.add_column("running", justify="right", no_wrap=True)
    table.add_column("up", justify="right", no_wrap=True)
    table.add_column("heartbeat", justify="right", no_wrap=True)
    for w in workers:
        table.add_row(
            str(w.id),
            w.hostname,
            str(w.pid),
            ",".join(w.queues),
            f"{w.running}/{w.concurrency}",
            words.age(w.heartbeat_at - w.started_at + w.silent_for),
            f"{words.age(w.silent_for)} ago",
        )
    console.print(table)


def print_watchdog(console: Console, report: health.WatchdogReport) -> None:
    limit = words.age(report.max_age)
    if not report.holders:
        console.print(f"nothing has held back the xmin horizon for {limit} or more")
        return
    title = f"holding back the xmin horizon for {limit} or more"
    console.print(_holder_table(console, title, report.holders))
    if not report.acted:
        pids = [h.pid for h in report.holders if h.terminable]
        console.print(f"dry run: would terminate {_pids(pids)}; --terminate does it")
        return
    console.print(f"terminated {_pids(report.terminated)}")
    for h in report.remaining:
        what = f"pid {h.pid}" if h.pid is not None else f"{h.kind} {h.name}"
        console.print(f"still holding back the horizon: {what} ({h.application_name or h.kind})")


def _holder_table(console: Console, title: str, holders: Sequence[health.HorizonHolder]) -> Table:
    """Age (or, for a slot, the xids it holds), pid, state, application and query."""
    table = Table(title=title, title_justify="left")
    table.add_column("age", justify="right", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("state", min_width=7)
    table.add_column("application", overflow="fold", min_width=11)
    # A no_wrap column without max_width squeezes the others to nothing in rich.
    query_width = max(16, console.width - 56)
    table.add_column("query", no_wrap=True, overflow="ellipsis", max_width=query_width)
    for h in holders:
        xids = h.xmin_age if h.xmin_age is not None else h.catalog_xmin_age
        table.add_row(
            words.age(h.age) if h.age is not None or xids is None else f"{xids:,} xids",
            "-" if h.pid is None else str(h.pid),
            h.state or "-",
            (h.application_name if h.kind == "session" else h.name) or "-",
            " ".join((h.query or "").split()) or "-",
        )
    return table


def _pids(pids: Sequence[int | None]) -> str:
    return "pid " + ", ".join(map(str, pids)) if pids else "nothing"


def _when(moment: datetime | None) -> str:
    return "never" if moment is None else moment.isoformat(timespec="seconds")


def print_jobs(console: Console, page: JobPage) -> None:
    """A page of job records as a table, and how to get the next page."""
    if not page.jobs:
        console.print("no jobs match")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("queue", overflow="ellipsis", no_wrap=True, max_width=16)
    table.add_column("task", overflow="ellipsis", no_wrap=True, max_width=28)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("created", no_wrap=True)
    table.add_column("run", justify="right", no_wrap=True)
    # The last error only where it fits (`jobs show` has it in full): rich squeezes the
    # other columns to nothing before it drops a no_wrap one.
    error_width = console.width - 90
    if error_width >= 16:
        table.add_column("last error", overflow="ellipsis", no_wrap=True, max_width=error_width)
    for job in page.jobs:
        cells = [
            str(job.id),
            job.status.value,
            job.queue,
            job.task,
            f"{job.attempt}/{job.max_attempts}",
            job.created_at.astimezone().strftime("%m-%d %H:%M:%S"),
            words.age(job.run_time),
        ]
        table.add_row(*cells, *([job.last_error or ""] if error_width >= 16 else []))
    console.print(table)
    if page.next_before_id is not None:
        console.print(f"more: --before-id {page.next_before_id}")


def _progress(report: dict[str, object]) -> str:
    fraction = report.get("fraction")
    done = f"{fraction:.0%}" if isinstance(fraction, (int, float)) else "-"
    meta = report.get("meta")
    return " ".join(
        part
        for part in (done, str(report.get("message") or ""), json.dumps(meta) if meta else "")
        if part
    )


def print_workflow(console: Console, flow: Workflow) -> None:
    """A workflow's jobs in order: status, attempts, what each still waits for."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(flow.counts.items()))
    state = "finished" if flow.finished else "running"
    jobs = words.plural(len(flow.jobs), "job")
    console.print(f"workflow {flow.id}: {jobs}, {state} ({counts})")
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", justify="right", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("task", overflow="ellipsis", no_wrap=True, max_width=28)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column("waits for", overflow="ellipsis", no_wrap=True, max_width=30)
    table.add_column("progress", overflow="ellipsis", no_wrap=True, max_width=24)
    for job in flow.jobs:
        waits = ", ".join(str(i) for i in job.pending)
        if len(job.waits_for) > len(job.pending):
            waits = f"{waits} ({len(job.waits_for) - len(job.pending)} done)".strip()
        table.add_row(
            str(job.id),
            job.status.value,
            job.task,
            str(job.attempt),
            waits,
            _progress(job.progress) if job.progress else "",
        )
    console.print(table)


def print_job(console: Console, shown: tuple[Job, JobSteps | None]) -> None:
    """One job's record, field by field, with each failed attempt and the last traceback;
    then, for a durable job, what it waits for and its steps."""
    job, steps = shown
    _print_record(console, job)
    if steps is not None:
        _print_steps(console, steps)


def _print_steps(console: Console, steps: JobSteps) -> None:
    """What a durable job waits for, and its steps as a table: seq, name, state, duration
    and result, the names and results sharing what the console leaves and cut with an
    ellipsis (`--json` has them whole)."""
    if steps.waiting_for is not None:
        until = (
            ", no timeout"
            if steps.waiting_until is None
            else f" until {_when(steps.waiting_until)}"
        )
        console.print(f"{'waiting for':>16}: signal {steps.waiting_for!r}{until}")
    if steps.sleeping_until is not None:
        console.print(f"{'sleeping until':>16}: {_when(steps.sleeping_until)}")
    if not steps.steps:
        return
    headers = ("seq", "name", "state", "took", "result")
    rows = [
        (str(s.seq), s.name, s.state, words.age(s.duration), _compact(s.result))
        for s in steps.steps
    ]
    natural = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    fixed = natural[0] + natural[2] + natural[3]
    shared = _share([natural[1], natural[4]], console.width - fixed - 2 * (len(headers) - 1))
    widths = [natural[0], shared[0], natural[2], natural[3], shared[1]]
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for header, width in zip(headers, widths, strict=True):
        table.add_column(
            header, no_wrap=True, width=width, justify="right" if header == "seq" else "left"
        )
    for row in rows:
        table.add_row(*(_cut(cell, width) for cell, width in zip(row, widths, strict=True)))
    console.print(table)


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _print_record(console: Console, job: Job) -> None:
    fields = {
        "id": job.id,
        "status": job.status.value,
        "queue": job.queue,
        "task": job.task,
        "args": json.dumps(job.args),
        "attempt": f"{job.attempt} of {job.max_attempts}",
        "priority": job.priority,
        "created": _when(job.created_at),
        "run at": _when(job.run_at),
        "started": _when(job.started_at),
        "finished": _when(job.finished_at),
        "queue wait": words.age(job.wait_time),
        "run time": words.age(job.run_time),
        "worker": job.worker_id if job.worker_id is not None else "-",
        "result": json.dumps(job.result),
    }
    optional = {
        "dedupe key": job.dedupe_key,
        "retry of": job.retry_of,
        "cancel requested": _when(job.cancel_requested_at) if job.cancel_requested_at else None,
        "atomic": "yes" if job.atomic else None,
        "concurrency key": job.concurrency_key,
        "limit keys": ", ".join(job.limit_keys) if job.limit_keys else None,
        "fairness key": job.fairness_key,
        "tags": ", ".join(job.tags) if job.tags else None,
        "workflow": job.workflow_id,
        "progress": _progress(job.progress) if job.progress else None,
    }
    fields |= {name: value for name, value in optional.items() if value is not None}
    for name, value in fields.items():
        console.print(f"{name:>16}: {value}")
    for error in job.errors:
        console.print(f"attempt {error.get('attempt')} at {error.get('at')}: {error.get('error')}")
    if job.errors and job.errors[-1].get("traceback"):
        console.print(str(job.errors[-1]["traceback"]).rstrip())
