"""Debian's Chromium, driven by Playwright, as every browser test launches it.

Playwright's own browser download cannot be relied on, so the tests use the system's
/usr/bin/chromium (.ci/run installs it); without it, or without playwright, a test module
that calls `require()` skips and says which is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
# No sandbox (tests run as root), and no background requests: the machine has no network.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require() -> Any:
    """Playwright's sync API, or a skip of the calling module naming what is missing."""
    api = pytest.importorskip(
        "playwright.sync_api", reason="the browser tests need playwright (pip install playwright)"
    )
    if not os.path.exists(CHROMIUM):
        pytest.skip(
            f"the browser tests need Debian's chromium at {CHROMIUM} "
            "(apt-get install chromium chromium-driver; .ci/run installs it)",
            allow_module_level=True,
        )
    return api


def launched(api: Any) -> Iterator[Any]:
    """A headless Chromium for a module's tests, closed after them."""
    with api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield chromium
        chromium.close()
