"""The store is the only Python that runs pgqueue's SQL, and its signatures are typed.

Each file of sql/queries has one module in pgqueue/store, and no other module of the
library names one of its queries. A query nobody runs is dead SQL, and fails too.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "sql" / "queries"
LIBRARY = ROOT / "pgqueue"
STORE = LIBRARY / "store"
# The grants are applied with the migrations, so one module runs both files.
MODULE_OF = {"grant": "migrations"}
HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def _names(sql_file: Path) -> list[str]:
    return HEADER.findall(sql_file.read_text())


def _sources() -> dict[Path, str]:
    return {path: path.read_text() for path in LIBRARY.rglob("*.py")}


@pytest.mark.parametrize("sql_file", sorted(QUERIES.glob("*.sql")), ids=lambda p: p.stem)
def test_each_query_is_run_by_its_store_module_alone(sql_file: Path) -> None:
    owner = STORE / f"{MODULE_OF.get(sql_file.stem, sql_file.stem)}.py"
    assert owner.is_file(), f"{sql_file.name} has no store module {owner.name}"
    sources = _sources()
    names = _names(sql_file)
    assert names
    for name in names:
        users = sorted(
            str(path.relative_to(ROOT)) for path, text in sources.items() if f'"{name}"' in text
        )
        assert users == [str(owner.relative_to(ROOT))], f"query {name} is named in {users}"


def test_no_library_module_outside_the_store_loads_a_query() -> None:
    loader = re.compile(r"from pgqueue\.queries import [^\n]*\b(query|statement)\b")
    outside = [
        str(path.relative_to(ROOT))
        for path, text in _sources().items()
        if STORE not in path.parents and loader.search(text)
    ]
    assert outside == []


def _store_modules() -> list[str]:
    return sorted(
        f"pgqueue.store.{path.stem}" for path in STORE.glob("*.py") if path.stem != "__init__"
    )


@pytest.mark.parametrize("module_name", _store_modules())
def test_the_store_signatures_name_no_any(module_name: str) -> None:
    module = importlib.import_module(module_name)
    found = []
    for name, value in vars(module).items():
        if name.startswith("_") or getattr(value, "__module__", None) != module_name:
            continue
        members = [(name, value)]
        if inspect.isclass(value):
            members += [
                (f"{name}.{attr}", member)
                for attr, member in vars(value).items()
                if not attr.startswith("_") and inspect.isfunction(member)
            ]
        for label, member in members:
            annotations = getattr(member, "__annotations__", {})
            found += [f"{label}: {a}" for a in annotations.values() if "Any" in str(a)]
    assert found == []


def test_the_store_imports_the_codec_not_the_task_registry() -> None:
    importers = sorted(
        str(path.relative_to(ROOT))
        for path in STORE.glob("*.py")
        if re.search(
            r"^\s*(from pgqueue\.registry import|from pgqueue import registry)",
            path.read_text(),
            re.M,
        )
    )
    assert importers == []


# A column read by its position: `row[3]`, `r[3]`, `rows[0][3]`.
BY_POSITION = re.compile(r"\b(?:row|r|rows\[\d+\])\[\d")


def test_no_module_reads_a_column_by_position() -> None:
    """Rows are dataclasses named after their columns (psycopg's args_row or class_row, or
    pgqueue.store.plan.rows_as): a column added to a statement cannot shift another's."""
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path, text in _sources().items()
        for number, line in enumerate(text.splitlines(), 1)
        if BY_POSITION.search(line)
    ]
    assert found == []


def test_the_position_check_sees_each_way_of_reading_by_position() -> None:
    for line in ("x = row[0]", "r[10] for r in rows", "int(rows[0][1])"):
        assert BY_POSITION.search(line), line
    for line in ("row.id", "rows[0] is None", "arrow[0]", "order[1]"):
        assert not BY_POSITION.search(line), line
