"""The built documentation site in a real browser: headless Chromium (Debian's package) driven
by Playwright, against site/ served on 127.0.0.1 by a plain HTTP server.

`make docs` builds the site (.ci/run does before the tests). With PGQUEUE_SCREENSHOTS set to a
folder, the home page and a how-to are saved there as docs-home.png and docs-howto.png.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from tests import chromium
from tests.docs.blocks import DOCS, ROOT

SITE = ROOT / "site"
playwright_api = chromium.require()
if not (SITE / "index.html").exists():
    pytest.skip("the documentation site is not built: run `make docs`", allow_module_level=True)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium.launched(playwright_api)


@pytest.fixture
def tab(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    yield context.new_page()
    context.close()


def page_urls(base: str) -> set[str]:
    """The URL each page under docs/ is built to."""
    urls = set()
    for md in DOCS.rglob("*.md"):
        if "_hooks" in md.parts:
            continue
        rel = md.relative_to(DOCS).with_suffix("").as_posix()
        urls.add(base if rel == "index" else urljoin(base, rel + "/"))
    return urls


def shoot(tab: Any, name: str) -> None:
    folder = os.environ.get("PGQUEUE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=False)


def test_the_navigation_reaches_every_page_and_none_is_empty(tab: Any, served: str) -> None:
    expected = page_urls(served)
    seen: set[str] = set()
    todo = [served]
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        response = tab.goto(url)
        assert response is not None and response.status == 200, url
        seen.add(url)
        article = tab.inner_text("article")
        heading = tab.inner_text("article h1")
        assert heading.strip(), f"{url} has no title"
        assert len(article.strip()) > len(heading) + 200, f"{url} is all but empty"
        for href in tab.eval_on_selector_all(
            "nav.md-nav--primary a.md-nav__link[href]", "links => links.map(a => a.href)"
        ):
            parts = urlsplit(href)
            target = f"{parts.scheme}://{parts.netloc}{parts.path}"
            if target.startswith(served) and target not in seen:
                todo.append(target)
    assert seen == expected, {
        "not reached": sorted(expected - seen),
        "not a page": sorted(seen - expected),
    }


def test_a_click_in_the_navigation_opens_the_page(tab: Any, served: str) -> None:
    tab.goto(served)
    shoot(tab, "docs-home")
    tab.click("nav.md-nav--primary >> text=Run workflows")
    tab.wait_for_url(served + "how-to/workflows/")
    assert "chain, group, chord" in tab.inner_text("article h1")
    shoot(tab, "docs-howto")


def test_the_search_box_finds_a_term(tab: Any, served: str) -> None:
    tab.goto(served)
    tab.click(".md-search__input")
    # Typed as a reader types, key by key; the index is built in a web worker after the page
    # loads, and a query typed before it is ready runs once it is.
    tab.locator("input.md-search__input").press_sequentially("PgBouncer")
    result = tab.wait_for_selector(
        "li.md-search-result__item a[href*='how-to/pgbouncer']", timeout=60_000
    )
    assert "PgBouncer" in result.inner_text()


def test_a_diagram_renders_with_the_network_off(browser: Any, served: str) -> None:
    # Every request off this machine is refused, as on a reader's laptop without a network:
    # mermaid must come with the site, not from a CDN.
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    refused: list[str] = []

    def offline(route: Any) -> None:
        if route.request.url.startswith(served):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    context.route("**/*", offline)
    try:
        tab = context.new_page()
        tab.goto(served + "explanation/lifecycle/")
        # The theme replaces the diagram's source (a pre) with a div holding the drawing in a
        # closed shadow root, which a test cannot look into: the div and its size are the sign.
        diagram = tab.wait_for_selector("article div.mermaid", timeout=30_000)
        assert diagram.bounding_box()["height"] > 100
        assert tab.query_selector("article pre.mermaid") is None
        assert "stateDiagram" not in tab.inner_text("article"), "the diagram shows as its source"
    finally:
        context.close()
    assert not refused, refused
