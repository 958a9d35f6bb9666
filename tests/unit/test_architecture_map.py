"""docs/ARCHITECTURE.md is the map of pgqueue/: every module is on it, and every file it names
exists, so the map cannot fall behind a move or a new module."""

from __future__ import annotations

import re

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
