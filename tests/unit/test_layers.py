"""pgqueue is built in layers (docs/ARCHITECTURE.md names them): a module imports only modules
of its own layer or of layers below, and no import leads back to where it started. Imports
are read with ast, those inside functions and under TYPE_CHECKING included, so a circle
cannot hide behind a lazy import. It also keeps each class to one role: none longer than
CLASS_LINES lines but those named."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

LIBRARY = ROOT / "pgqueue"

# From the bottom up; a module belongs to the first prefix it falls under, most specific
# first within a layer (a package's prefix takes its submodules).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "domain",
        (
            "pgqueue._version",
            "pgqueue.errors",
            "pgqueue.models",
            "pgqueue.codec",
            "pgqueue.values",
            "pgqueue.registry",
            "pgqueue.hooks",
            "pgqueue.steps",
            "pgqueue.tenants",
            "pgqueue.schedule",
            "pgqueue.workflow",
            "pgqueue.words",
            "pgqueue.wakeup",
            "pgqueue.dsn",
            "pgqueue.bulk",
        ),
    ),
    ("store", ("pgqueue.store", "pgqueue.queries")),
    ("runtime", ("pgqueue.runtime",)),
    ("client", ("pgqueue.queue", "pgqueue.migrate", "pgqueue.health")),
    ("relay/history", ("pgqueue.relay", "pgqueue.history")),
    ("worker", ("pgqueue.worker",)),
    (
        "edges",
        (
            "pgqueue.cli",
            "pgqueue.dashboard",
            "pgqueue.contrib",
            "pgqueue.citus",
            "pgqueue.metrics",
            "pgqueue.tracing",
            "pgqueue.sinks",
            "pgqueue.testing",
            "pgqueue.pytest_plugin",
            "pgqueue.embedded",
            "pgqueue.__main__",
            "pgqueue",
        ),
    ),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in LIBRARY.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "pgqueue"):
            return rank
    return len(LAYERS) - 1 if module == "pgqueue" else None


def _target(name: str) -> str | None:
    """The module of pgqueue that importing `name` runs: itself, or the nearest package."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> Iterator[str]:
    """The pgqueue modules `module` imports, anywhere in its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    yield from _imported(path.read_text(), module, package)


def _imported(source: str, module: str, package: str) -> Iterator[str]:
    """The pgqueue modules that `source`, the text of `module` in `package`, imports."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            source = ".".join(p for p in (base if node.level else "", node.module or "") if p)
            names = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            target = _target(name)
            if target is not None and target != module:
                yield target


def _graph() -> dict[str, set[str]]:
    return {module: set(_imports(module)) for module in MODULES}


def test_every_module_has_a_layer() -> None:
    assert sorted(m for m in MODULES if _layer(m) is None) == []


def test_no_module_imports_a_module_of_a_higher_layer() -> None:
    upward = []
    for module, targets in sorted(_graph().items()):
        mine = _layer(module)
        assert mine is not None
        for target in sorted(targets):
            theirs = _layer(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{module} ({LAYERS[mine][0]}) -> {target} ({LAYERS[theirs][0]})")
    assert upward == []


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph`, as the modules along it, or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" once every arrow was seen
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module)) is not None:
            return found
    return None


def test_pgqueue_has_no_import_circle() -> None:
    assert _circle(_graph()) is None


def test_the_circle_check_finds_a_circle_through_a_lazy_import() -> None:
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    source = (
        "from typing import TYPE_CHECKING\n"
        "from . import errors\n"
        "if TYPE_CHECKING:\n"
        "    from pgqueue.registry import Task\n"
        "def later() -> None:\n"
        "    from pgqueue.worker import loop\n"
        "    import pgqueue.store.jobs\n"
    )
    found = sorted(_imported(source, "pgqueue.models", "pgqueue"))
    assert found == [
        "pgqueue.errors",
        "pgqueue.registry",
        "pgqueue.store.jobs",
        "pgqueue.worker.loop",
    ]


# A class past this many lines does more than one thing; split it by role. The public
# facades are exempt: their length is their documentation.
CLASS_LINES = 250
LONG_CLASSES_ALLOWED = {"pgqueue.queue.sync.Queue", "pgqueue.queue.aio.AsyncQueue"}


def _class_lengths() -> dict[str, int]:
    """Each class of pgqueue, by module and name, and its lines (docstring included)."""
    found = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                found[f"{module}.{node.name}"] = node.end_lineno - node.lineno + 1
    return found


def test_no_class_is_longer_than_the_limit_but_the_facades() -> None:
    lengths = _class_lengths()
    too_long = {
        name: n
        for name, n in sorted(lengths.items())
        if n > CLASS_LINES and name not in LONG_CLASSES_ALLOWED
    }
    assert too_long == {}  # each with its lines
    assert set(lengths) >= LONG_CLASSES_ALLOWED  # a name that moved is renamed here too
