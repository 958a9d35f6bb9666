"""docs/ARCHITECTURE.md is the map of pgqueue/: every module is on it, and every file it names
exists, so the map cannot fall behind a move or a new module. And the worker's rooms keep to
their roles: its services never reach back into the worker that wires them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

MAP = ROOT / "docs" / "ARCHITECTURE.md"
LIBRARY = ROOT / "pgqueue"
NAMED = re.compile(r"`([\w./*-]+\.(?:py|sql))`")


def _named() -> set[str]:
    return set(NAMED.findall(MAP.read_text()))


def test_every_module_of_pgqueue_is_on_the_map() -> None:
    named = _named()
    modules = sorted(str(path.relative_to(ROOT)) for path in LIBRARY.rglob("*.py"))
    assert modules
    assert [m for m in modules if m not in named] == []


def test_every_file_the_map_names_exists() -> None:
    missing = []
    for name in sorted(_named()):
        if name.startswith(("pgqueue/", "sql/")):
            pattern = name.replace("NNNN", "[0-9][0-9][0-9][0-9]")
            found = list(ROOT.glob(pattern))
        else:  # a bare query file is in sql/queries; a bare module, relative to pgqueue/
            base = ROOT / "sql" / "queries" if name.endswith(".sql") else LIBRARY
            found = [base / name] if (base / name).is_file() else []
        if not found:
            missing.append(name)
    assert missing == []


def _imported(path: Path) -> set[str]:
    """Every module, and every name of a module, that `path` imports, relative imports
    resolved from the package it is in."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_no_module_of_the_worker_but_worker_py_imports_the_worker() -> None:
    """The services talk through events (worker/events.py); one that imported the worker
    could call back into it."""
    worker = {"pgqueue.worker.worker", "pgqueue.Worker", "pgqueue.worker.worker.Worker"}
    offenders = {
        str(path.relative_to(ROOT)): sorted(_imported(path) & worker)
        for path in sorted((LIBRARY / "worker").glob("*.py"))
        if path.name != "worker.py"
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_no_module_of_the_client_imports_the_worker() -> None:
    """An application that only enqueues and waits loads pgqueue/queue/, never the worker:
    imports inside functions and under TYPE_CHECKING count too."""
    reaching = {
        str(path.relative_to(ROOT)): sorted(
            name for name in _imported(path) if name.startswith("pgqueue.worker")
        )
        for path in sorted((LIBRARY / "queue").rglob("*.py"))
    }
    assert reaching
    assert {path: names for path, names in reaching.items() if names} == {}


def test_metrics_and_tracing_read_the_worker_through_hooks_only() -> None:
    """Observers implement and read the protocols of pgqueue/hooks.py, never the worker's
    modules: a change inside worker/ cannot break them unseen."""
    reaching = {
        name: sorted(m for m in _imported(LIBRARY / name) if m.startswith("pgqueue.worker"))
        for name in ("metrics.py", "tracing.py")
    }
    assert reaching == {"metrics.py": [], "tracing.py": []}
