"""MkDocs hook: writes the reference pages' generated parts from the code at build time.

A page asks for a part with a line `<!-- generated: NAME -->`; the hook replaces it with
Markdown built from the source of truth, so the page cannot drift from the code:

- `cli`: every command's `--help`, from the argparse parser itself (pgqueue/cli/parser.py);
- `metrics`: every Prometheus metric, its type, labels and help, from pgqueue/metrics.py;
- `log-fields`: the fields of `--log-format json`, from pgqueue/worker/observe.py;
- `settings`: every field of the settings models, its type, default and range;
- `sql-functions`: the SQL functions applications call, from their latest migration;
- `errors`: the exception tree of pgqueue/errors.py;
- `changelog`: CHANGELOG.md, written once at the root of the checkout.

A new metric, log field or setting without a meaning written below fails the build (the
site is built in strict mode), so whoever adds one also says what it means.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pgqueue

# The checkout the site documents: where the pgqueue package lives, not where this file is,
# so a copy of docs/ (tests/docs/test_build.py builds one) documents the same code.
ROOT = Path(pgqueue.__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.M)
HELP_COLUMNS = "100"  # the width the CLI page and its test render `--help` at


class GeneratorError(Exception):
    """A generated part cannot be written: the build stops and says why."""


# ---------------------------------------------------------------------------- the CLI


def cli_parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command line, parser) for `pgqueue` and every subcommand, depth first, in the order
    the parser lists them. The test of the CLI page walks the same tree."""
    from pgqueue.cli import parser as cli_parser

    Parsers = Iterator[tuple[str, argparse.ArgumentParser]]

    def walk(name: str, p: argparse.ArgumentParser) -> Parsers:
        yield name, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from walk(f"{name} {sub_name}", sub)

    yield from walk("pgqueue", cli_parser.build())


def help_text(p: argparse.ArgumentParser) -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        return p.format_help().rstrip()
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def cli() -> str:
    out = []
    for name, p in cli_parsers():
        depth = "##" if name.count(" ") <= 1 else "###"
        out += [f"{depth} `{name}`", "", "```text", help_text(p), "```", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- metrics

FAMILY_TYPES = {
    "CounterMetricFamily": "counter",
    "GaugeMetricFamily": "gauge",
    "HistogramMetricFamily": "histogram",
}
WORKER_ONLY = {"WorkerMetrics", "WorkerCollector"}


def metric_families() -> list[dict[str, Any]]:
    """Each `*MetricFamily(name, help, ..., labels=[...])` call in pgqueue/metrics.py, with
    the class that serves it."""
    tree = ast.parse((ROOT / "pgqueue/metrics.py").read_text())
    found = []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for call in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
            kind = FAMILY_TYPES.get(getattr(call.func, "id", ""))
            if kind is None:
                continue
            name = ast.literal_eval(call.args[0])
            doc = ast.literal_eval(call.args[1])
            labels: list[str] = []
            for kw in call.keywords:
                if kw.arg == "labels":
                    labels = ast.literal_eval(kw.value)
            exposed = f"{name}_total" if kind == "counter" else name
            source = "worker" if cls.name in WORKER_ONLY else "worker and dashboard"
            found.append(
                {"name": exposed, "type": kind, "labels": labels, "help": doc, "from": source}
            )
    if not found:
        raise GeneratorError("no metric families found in pgqueue/metrics.py")
    return found


def metrics() -> str:
    rows = ["| metric | type | labels | served by | meaning |", "|---|---|---|---|---|"]
    for m in metric_families():
        labels = ", ".join(f"`{label}`" for label in m["labels"]) or "none"
        rows.append(f"| `{m['name']}` | {m['type']} | {labels} | {m['from']} | {m['help']} |")
    return "\n".join(rows) + "\n"


LOG_FIELDS = {
    "at": "when, as an ISO 8601 time in UTC",
    "event": "`job.succeeded`, `job.failed`, `job.retried`, `job.snoozed` or `job.cancelled`",
    "job_id": "the job's id",
    "task": "the task's registered name",
    "queue": "the job's queue",
    "attempt": "this attempt's number, from 1",
    "max_attempts": "the attempts the job may have",
    "worker_id": "the id of the worker that ran it (`pgqueue workers`)",
    "duration_seconds": "how long the handler ran",
    "error": "the exception, as `Type: message` (failed attempts only)",
    "error_type": "the exception's class path (failed attempts only)",
    "retry_in_seconds": "the wait before the next attempt (`job.retried` and `job.snoozed`)",
    "level": "the record's level: `debug`, `info`, `warning` or `error`",
    "logger": "the logger's name, such as `pgqueue.worker`",
    "message": "the message",
    "traceback": "the exception's traceback, when the record carries one",
}


def log_keys(cls_name: str) -> list[str]:
    """The keys a JSON log class writes: its dict literal's and those assigned after."""
    tree = ast.parse((ROOT / "pgqueue/worker/observe.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    keys: list[str] = []
    for node in ast.walk(cls):
        if isinstance(node, ast.Dict):
            keys += [str(k.value) for k in node.keys if isinstance(k, ast.Constant)]
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                    keys.append(str(target.slice.value))
    return list(dict.fromkeys(keys))


def log_fields() -> str:
    out = []
    for cls, what in (
        ("JsonLog", "One line per attempt's outcome"),
        ("JsonFormatter", "The worker's other log records"),
    ):
        out += [f"**{what}** (`{cls}`):", "", "| field | meaning |", "|---|---|"]
        for key in log_keys(cls):
            if key not in LOG_FIELDS:
                raise GeneratorError(f"log field {key!r} has no meaning in docs/_hooks")
            out.append(f"| `{key}` | {LOG_FIELDS[key]} |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------- settings

SETTINGS_MEANINGS: dict[str, dict[str, str]] = {
    "QueueSettings": {
        "schema_name": "schema of the tables (an identifier, quoted by psycopg.sql); "
        "given as `schema=`",
        "keep_history": "finished jobs move to `job_history`; `False` deletes them",
        "max_payload_bytes": "larger arguments are refused at enqueue; a larger result "
        "fails its job",
        "prepare": "server-side prepared statements on the queue's own pool; `False` "
        "behind PgBouncer's transaction pooling",
    },
    "JobOptions": {
        "queue": "the queue the job goes to",
        "priority": "-100..100, lower runs first",
        "max_attempts": "attempts before the job fails for good",
        "run_at": "not run before this time (at most ten years ahead)",
        "delay": "not run before this long from now; give `delay` or `run_at`, not both",
        "dedupe_key": "one live job per key: a second enqueue returns the first's id",
        "dedupe_window": "how long a finished job still dedupes its key",
        "concurrency_key": "at most the key's limit of jobs with it run at once (a tenant)",
        "limits": "more limit keys, or templates of them (`tenant:{tenant_id}`): the job starts "
        "when every key has room",
        "fairness_key": "shares the queue's starts between keys by weight (a template too)",
        "tags": "labels to find the job by (up to 32, 1-128 characters each)",
        "shard_key": "on Citus, the shard the job goes to (a template too); "
        "see Running on Citus",
    },
    "RetryPolicy": {
        "base": "the first retry's delay; it doubles with each attempt",
        "cap": "the longest delay between attempts",
        "jitter": "each delay is multiplied by a random factor in 1 ± jitter",
    },
    "TaskPolicy": {
        "retry": "the backoff between attempts",
        "timeout": "an attempt running longer fails (atomic tasks: 60 s, at most 15 min)",
        "on_lost": "when the job's worker stops heartbeating: `retry`, `fail`, `abandon` "
        "or `compensate`",
        "compensate_with": "the task enqueued when `on_lost='compensate'`",
    },
    "WorkerSettings": {
        "queues": "the queues served; `('*',)` (`--queues all`) serves every queue the tasks name",
        "concurrency": "jobs at once; a claim takes at most the free slots",
        "batch_size": "the most one claim statement takes",
        "poll_interval": "claim this often even without a wake-up",
        "claim_cooldown": "while jobs keep arriving, the least time from one claim to the "
        "next, so they share a claim; never waited after a quiet spell or a full claim",
        "poll_only": "no LISTEN, no prepared statements and no recorded session (behind PgBouncer)",
        "hint_reset_interval": "how often the claim hint is forgotten (the safety net)",
        "hint_reset_jitter": "the spread of that interval, as a fraction",
        "quiet_after": "how long every slot must be busy before the worker stops asking for "
        "wake-ups its next claim does not need; `None`: every enqueue notifies",
        "shutdown_grace": "the time running jobs get after SIGTERM",
        "heartbeat_interval": "how often the worker proves it is alive",
        "lease_timeout": "silence after which a worker's jobs are rescued (at least two "
        "heartbeats); a worker whose process died is found by its ended session sooner",
        "rescue_interval": "how often the rescuer looks for silent workers",
        "promote_batch": "due scheduled jobs made queued per statement",
        "atomic_concurrency": "atomic jobs at once, per kind (`def`, `async def`)",
        "horizon_warning": "warn while a transaction holds the xmin horizon longer",
        "burst": "exit once the queues are empty",
        "name": "a name shown in `pgqueue workers` and the dashboard",
        "periodic": "run the scheduler of the application's recurring jobs",
        "history_retention": "delete history older than this (1 min to 100 years); `None` keeps it",
        "prune_interval": "how often retention runs",
        "prune_batch": "rows deleted per batch",
    },
}


def _fmt_default(value: Any) -> str:
    from datetime import timedelta

    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        for unit, size in (("h", 3600), ("min", 60)):
            if seconds >= size and seconds % size == 0:
                return f"{seconds / size:g} {unit}"
        return f"{seconds:g} s"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024 * 1024:
        return f"{value / 1024 / 1024:g} MiB"
    if value is None:
        return "none"
    if hasattr(value, "model_dump"):
        return f"`{type(value).__name__}()`"
    return f"`{value!r}`"


def _fmt_type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    text = text.replace("datetime.", "").replace("typing.", "").replace("NoneType", "None")
    return text


def _fmt_range(field: Any) -> str:
    bounds = []
    for item in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if getattr(item, attr, None) is not None:
                bounds.append(f"{sign} {getattr(item, attr)}")
    return ", ".join(bounds)


def settings() -> str:
    from pgqueue import models

    out = []
    for cls_name, meanings in SETTINGS_MEANINGS.items():
        model = getattr(models, cls_name)
        out += [
            f"### `{cls_name}`",
            "",
            inspect.cleandoc(model.__doc__ or ""),
            "",
            "| setting | type | default | range | meaning |",
            "|---|---|---|---|---|",
        ]
        for name, field in model.model_fields.items():
            if name not in meanings:
                raise GeneratorError(f"{cls_name}.{name} has no meaning in docs/_hooks")
            default = field.get_default(call_default_factory=True)
            out.append(
                f"| `{name}` | `{_fmt_type(field.annotation)}` | {_fmt_default(default)} "
                f"| {_fmt_range(field)} | {meanings[name]} |"
            )
        extra = set(meanings) - set(model.model_fields)
        if extra:
            raise GeneratorError(f"{cls_name} has no settings {sorted(extra)}")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------- SQL

USER_FUNCTIONS = ("enqueue", "enqueue_many", "signal")


def sql_definition(name: str) -> tuple[str, str, str]:
    """(migration file, its leading comment, the signature) of the latest migration that
    creates `pgqueue.NAME`."""
    pattern = re.compile(
        r"CREATE (?:OR REPLACE )?FUNCTION \{schema\}\." + re.escape(name) + r"\((.*?)\)\s*"
        r"(RETURNS [^\n]+)",
        re.S,
    )
    latest = None
    for path in sorted((ROOT / "sql/migrations").glob("*.sql")):
        text = path.read_text()
        match = pattern.search(text)
        if match:
            latest = (path, text, match)
    if latest is None:
        raise GeneratorError(f"no migration creates the SQL function {name}")
    path, text, match = latest
    comment = []
    for line in text.splitlines():
        if not line.startswith("--"):
            break
        comment.append(line[2:].removeprefix(" "))
    comment[0] = re.sub(r"^\d{4}: ", "", comment[0])  # the migration's number, said above
    params = ",\n".join(
        "    " + p.strip() for p in match.group(1).replace("{{}}", "{}").split(",\n")
    )
    signature = f"pgqueue.{name}(\n{params}\n) {match.group(2).strip()}"
    body = "\n".join(comment).replace("{schema}", "pgqueue").replace("{{", "{").replace("}}", "}")
    return path.name, body, signature


def sql_functions() -> str:
    out = []
    for name in USER_FUNCTIONS:
        migration, comment, signature = sql_definition(name)
        out += [
            f"## `pgqueue.{name}`",
            "",
            "```sql",
            signature,
            "```",
            "",
            f"From `sql/migrations/{migration}`:",
            "",
            "```text",
            comment,
            "```",
            "",
        ]
    return "\n".join(out)


# ---------------------------------------------------------------------------- errors


def errors() -> str:
    from pgqueue import errors as errors_module

    classes = [
        obj
        for obj in vars(errors_module).values()
        if inspect.isclass(obj) and issubclass(obj, errors_module.PgQueueError)
    ]

    def line(cls: type, depth: int) -> list[str]:
        others = [b.__module__ + "." + b.__qualname__ for b in cls.__bases__[1:]]
        also = f" (also a `{'`, `'.join(others)}`)" if others else ""
        doc = " ".join(inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].split())
        rows = [f"{'    ' * depth}- [`{cls.__name__}`](#pgqueue.{cls.__name__}){also}: {doc}"]
        for sub in classes:
            if sub.__bases__[0] is cls:
                rows += line(sub, depth + 1)
        return rows

    return "\n".join(line(errors_module.PgQueueError, 0)) + "\n"


def changelog() -> str:
    """CHANGELOG.md without its title: the page that shows it has its own."""
    text = (ROOT / "CHANGELOG.md").read_text()
    return text.split("\n", 1)[1].lstrip("\n")


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli,
    "metrics": metrics,
    "log-fields": log_fields,
    "settings": settings,
    "sql-functions": sql_functions,
    "errors": errors,
    "changelog": changelog,
}


def on_files(files: Any, config: Any) -> Any:
    """The benchmarks' charts, served from bench/results/ where the runs write them, so the
    explanation pages show the latest committed figures without a copy."""
    from mkdocs.structure.files import File

    for chart in sorted((ROOT / "bench/results").glob("*/*/*.png")):
        path = chart.relative_to(ROOT).as_posix()
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise GeneratorError(f"unknown generated part {name!r}")
        return GENERATORS[name]()

    return MARKER.sub(replace, markdown)
