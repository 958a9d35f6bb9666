"""The code blocks of the documentation pages, and the convention that says how each is run.

Every fenced block in Python, shell or SQL on a page under docs/ is an example that
tests/docs/test_examples.py runs, page by page, in the order it appears, against a database of
the page's own, from a folder of the page's own. An HTML comment just before a block changes
that, and renders as nothing:

- `<!-- file: NAME -->`: the block is written to NAME in the page's folder instead of being
  run (a module a later block imports, or that `pgqueue worker NAME:queue` loads).
- `<!-- test: skip REASON -->`: the block is not run; the reason says what runs it instead.
  Skips are counted, and must stay rare.
- A comment holding a block of its own, `<!-- test: setup` (or `<!-- test: check`) then a
  fenced block then `-->`, is run where it stands but not shown: what an example needs that a
  reader already has, or an assertion that the examples before it did what the page says.
  `<!-- test: after` likewise holds SQL run on the server once the page's database is
  dropped (roles are the server's, not the database's).

YAML and JSON blocks are parsed, so a manifest or a log line cannot be malformed. Blocks in
other languages (ini, dockerfile, cron, text, mermaid) are configuration shown for reading.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN = {"python", "sh", "sql"}
PARSE = {"yaml", "json"}
READ_ONLY = {"ini", "dockerfile", "cron", "text", "mermaid"}

TOKEN = re.compile(
    r"<!-- test: (?P<hidden>setup|check|after)\n```(?P<hlang>\w+)\n(?P<hcode>.*?)\n```\n-->"
    r"|<!-- (?P<directive>file: \S+|test: skip\b.*?) -->\n(?=[ \t]*```)"
    r"|^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str  # its path under docs/
    line: int
    lang: str
    code: str
    kind: str = "shown"  # or "setup", "after"
    file: str | None = None
    skip: str | None = None

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def blocks(page: Path, docs: Path = DOCS) -> list[Block]:
    text = page.read_text()
    name = page.relative_to(docs).as_posix()
    found: list[Block] = []
    directive: str | None = None
    for match in TOKEN.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match.group("hidden"):
            found.append(
                Block(name, line, match.group("hlang"), match.group("hcode") + "\n",
                      kind=match.group("hidden"))
            )  # fmt: skip
        elif match.group("directive"):
            directive = " ".join(match.group("directive").split())
        else:
            lang = match.group("lang") or "text"
            if lang not in RUN | PARSE | READ_ONLY:
                raise AssertionError(f"docs/{name}:{line}: a block in {lang!r}: name a language")
            code = textwrap.dedent(match.group("code"))
            file = skip = None
            if directive and directive.startswith("file: "):
                file = directive.removeprefix("file: ")
            elif directive:
                skip = directive.removeprefix("test: skip").strip()
                if not skip:
                    raise AssertionError(f"docs/{name}:{line}: a skip must say why")
            found.append(Block(name, line, lang, code, file=file, skip=skip))
            directive = None
    return found
