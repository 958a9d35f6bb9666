"""Every import the user documentation shows works: the `from pgqueue... import ...` lines of
the Python examples in README.md and the site's pages (docs/), and each
`pgqueue.module.Name` their text names."""

from __future__ import annotations

import importlib
import re

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FROM_IMPORT = re.compile(r"^\s*from (pgqueue[\w.]*) import (\([^)]*\)|[^\n#]+)", re.MULTILINE)
DOTTED_CLASS = re.compile(r"`(pgqueue(?:\.[a-z_]+)+)\.([A-Z]\w*)")


def _shown() -> list[tuple[str, str]]:
    shown = set()
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
            for module, names in FROM_IMPORT.findall(block):
                for name in names.strip("()").replace("\n", " ").split(","):
                    if name.strip():
                        shown.add((module, name.split(" as ")[0].strip()))
        shown.update(DOTTED_CLASS.findall(text))
    return sorted(shown)


def test_the_documentation_shows_imports_to_check() -> None:
    modules = {module for module, _ in _shown()}
    assert {"pgqueue", "pgqueue.relay", "pgqueue.sinks", "pgqueue.sinks.redis"} <= modules


@pytest.mark.parametrize(("module", "name"), _shown(), ids=lambda v: str(v))
def test_an_import_the_documentation_shows_works(module: str, name: str) -> None:
    if module.startswith("pgqueue.contrib.django.tasks"):
        pytest.importorskip(
            "django.tasks",
            reason="django.tasks needs Django 6, which needs Python 3.12: .ci/run checks this "
            "import in .venv-django (make test-django)",
        )
    imported = importlib.import_module(module)
    assert getattr(imported, name, None) is not None, f"from {module} import {name}"
