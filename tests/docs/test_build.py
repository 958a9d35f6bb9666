"""`make docs` builds in strict mode: a broken link or an API name that does not exist stops
the build instead of shipping a page that points nowhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_until
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


def test_make_docs_serve_serves_the_site_with_its_search_index() -> None:
    """Opened from disk, the built site has no pages at its folders' addresses and no search:
    `make docs-serve` is how a reader sees it, so it must serve both."""
    recipe = (ROOT / "Makefile").read_text().split("\ndocs-serve:", 1)[1].splitlines()[1]
    assert "mkdocs serve" in recipe and "$(DOCS_ADDR)" in recipe, recipe
    address = f"127.0.0.1:{free_port()}"
    base = f"http://{address}/"
    serving = subprocess.Popen(
        [sys.executable, "-m", "mkdocs", "serve", "--strict", "--dev-addr", address],
        cwd=ROOT, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def get(path: str) -> str | None:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, ConnectionError):
            assert serving.poll() is None, serving.communicate()[1]
            return None

    try:
        wait_until(lambda: get("how-to/wait/") is not None, timeout=240, what="mkdocs serve")
        assert "Wait for a job" in (get("how-to/wait/") or "")
        assert "PgBouncer" in (get("search/search_index.json") or "")
    finally:
        serving.terminate()
        serving.communicate(timeout=30)
