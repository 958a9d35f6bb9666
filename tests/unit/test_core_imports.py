"""The core imports no integration and no optional dependency: integrations plug in through
pgqueue/hooks.py. Read from the source with `ast`, so an import inside a function (run only
on some path) counts as much as one at the top of a module; an import a type checker alone
reads (under `if TYPE_CHECKING:`) does not run, and does not count."""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, packages_distributions, requires
from pathlib import Path

import pytest

from tests.conftest import ROOT

LIBRARY = ROOT / "pgqueue"
# The optional extras at the edge, each free to import its own dependency: the integrations,
# the dashboard, the command (and the embedded server only it starts), metrics, tracing, the
# pytest plugin (the `testing` extra: pytest loads it), and the relay's broker sinks with the
# import paths the documentation shows for them.
EDGE = (
    "pgqueue/contrib/",
    "pgqueue/dashboard/",
    "pgqueue/cli/",
    "pgqueue/embedded.py",
    "pgqueue/pytest_plugin.py",
    "pgqueue/metrics.py",
    "pgqueue/tracing.py",
    "pgqueue/relay/sinks/redis.py",
    "pgqueue/relay/sinks/rabbitmq.py",
    "pgqueue/relay/sinks/nats.py",
    "pgqueue/relay/sinks/celery.py",
    "pgqueue/sinks/redis.py",
    "pgqueue/sinks/rabbitmq.py",
    "pgqueue/sinks/nats.py",
    "pgqueue/sinks/celery.py",
)


def _core() -> list[Path]:
    modules = sorted(LIBRARY.rglob("*.py"))
    return [p for p in modules if not str(p.relative_to(ROOT)).startswith(EDGE)]


def _required(distribution: str) -> set[str]:
    """The distributions `distribution` always needs (those of no extra), and theirs: what
    installing pgqueue with no extra installs (pydantic brings pydantic-core)."""
    found: set[str] = set()
    try:
        specs = requires(distribution) or []
    except PackageNotFoundError:  # needed on other platforms only (a marker), not installed
        return found
    for spec in specs:
        name = _normal(re.split(r"[\s<>=!~;\[(]", spec, maxsplit=1)[0])
        if "extra ==" not in spec and name not in found:
            found |= {name} | _required(name)
    return found


@functools.cache
def _required_packages() -> set[str]:
    """The top-level packages of pgqueue's required dependencies."""
    wanted = _required("pgqueue-py")
    return {
        package
        for package, dists in packages_distributions().items()
        if any(_normal(dist) in wanted for dist in dists)
    }


def _normal(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[str]:
    """The modules `node` imports when it runs."""
    for child in ast.iter_child_nodes(node):
        if _type_checking(child):
            assert isinstance(child, ast.If)
            for other in child.orelse:
                yield from _imports(other)
            continue
        if isinstance(child, ast.Import):
            yield from (alias.name for alias in child.names)
        elif isinstance(child, ast.ImportFrom):
            base = "pgqueue" if child.level else (child.module or "")
            yield from (f"{base}.{alias.name}" for alias in child.names)
        yield from _imports(child)


def test_the_core_is_every_module_but_the_edge() -> None:
    core = {str(p.relative_to(ROOT)) for p in _core()}
    assert {"pgqueue/queue/sync.py", "pgqueue/hooks.py", "pgqueue/store/jobs.py"} <= core
    assert "pgqueue/contrib/sqlalchemy.py" not in core
    assert "pgqueue/tracing.py" not in core


@pytest.mark.parametrize("module", _core(), ids=lambda p: str(p.relative_to(LIBRARY)))
def test_a_core_module_imports_no_integration_and_no_optional_dependency(module: Path) -> None:
    allowed = _required_packages() | set(sys.stdlib_module_names) | {"pgqueue"}
    imported = sorted(set(_imports(ast.parse(module.read_text()))))
    integrations = [name for name in imported if name.startswith("pgqueue.contrib")]
    foreign = [name for name in imported if name.split(".")[0] not in allowed]
    assert (integrations, foreign) == ([], [])


def test_the_check_sees_an_import_inside_a_function_and_skips_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import sqlalchemy\n"
        "def f():\n    from pgqueue.contrib import sqlalchemy\n    import django\n"
    )
    assert set(_imports(ast.parse(source))) == {
        "typing.TYPE_CHECKING",
        "pgqueue.contrib.sqlalchemy",
        "django",
    }
    assert {"psycopg", "psycopg_pool", "pydantic"} <= _required_packages()
    assert "sqlalchemy" not in _required_packages()
