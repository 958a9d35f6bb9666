"""`make docs` builds in strict mode: a broken link or an API name that does not exist stops
the build instead of shipping a page that points nowhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import ROOT

pytest.importorskip("mkdocs", reason="the docs tools are the `docs` extra: run `make docs`")
pytest.importorskip("mkdocstrings", reason="the docs tools are the `docs` extra: run `make docs`")


def build(folder: Path) -> subprocess.CompletedProcess[str]:
    """The build `make docs` runs, on a copy of the site's sources in `folder`."""
    recipe = (ROOT / "Makefile").read_text().split("\ndocs:", 1)[1].splitlines()[1]
    assert "mkdocs build --strict" in recipe and "--quiet" not in recipe, recipe
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(folder / "site")],
        cwd=folder, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip


@pytest.fixture
def sources(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    return tmp_path


def test_a_broken_link_stops_the_build(sources: Path) -> None:
    page = sources / "docs" / "how-to" / "upgrade.md"
    page.write_text(page.read_text() + "\nSee [the old page](no-such-page.md).\n")
    done = build(sources)
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


def test_an_api_name_that_does_not_exist_stops_the_build(sources: Path) -> None:
    page = sources / "docs" / "reference" / "errors.md"
    page.write_text(page.read_text() + "\n::: pgqueue.NoSuchError\n")
    done = build(sources)
    assert done.returncode != 0
    assert "pgqueue.NoSuchError" in done.stderr
