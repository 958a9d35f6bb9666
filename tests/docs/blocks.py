"""The code blocks of the documentation pages, and the convention that says how each is run.

Every fenced block in Python, shell or SQL on a page under docs/ is an example that
tests/docs/test_examples.py runs, page by page, in the order it appears, against a database of
the page's own, from a folder of the page's own: the page's Python blocks in one fresh
interpreter, as a reader pastes them. What the test provides is only what the tutorial has a
reader set up first: a migrated database and PGQUEUE_DSN naming it. Everything else an example
needs is on the page, in a block a reader sees: a hidden setup block is refused, since a reader
who pastes the page would not have what it made.

An HTML comment just before a block changes how it is run, and renders as nothing:

- `<!-- file: NAME -->`: the block is written to NAME in the page's folder instead of being
  run (a module a later block imports, or that `pgqueue worker NAME:queue` loads).
- `<!-- test: skip REASON -->`: the block is not run; the reason says what runs it instead.
  Skips are counted, and must stay rare.
- A comment holding a block of its own, `<!-- test: check` then a fenced block then `-->`, is
  an assertion that the examples before it did what the page says, run where it stands but not
  shown; it runs in a copy of the page's namespace, so nothing it defines reaches the blocks
  after it. `<!-- test: after` likewise holds SQL run on the server once the page's database
  is dropped (roles are the server's, not the database's).

A `text` block titled Output (```` ```text title="Output" ````) shows what the block before it
prints, and the test compares the two: `...` in it stands for any text (a time, an id). Output
is shown that way only, never as a comment on a `print` line, where nothing would check it.

YAML and JSON blocks are parsed, so a manifest or a log line cannot be malformed. Blocks in
other languages (ini, dockerfile, cron, text, mermaid) are configuration shown for reading.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
RUN = {"python", "sh", "sql"}
PARSE = {"yaml", "json"}
READ_ONLY = {"ini", "dockerfile", "cron", "text", "mermaid"}

TOKEN = re.compile(
    r"<!-- test: (?P<hidden>setup|check|after)\n```(?P<hlang>\w+)\n(?P<hcode>.*?)\n```\n-->"
    r"|<!-- (?P<directive>file: \S+|test: skip\b.*?) -->\n(?=[ \t]*```)"
    r"|^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)(?P<info>[^\n]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    re.S | re.M,
)


@dataclass(frozen=True)
class Block:
    page: str  # its path under docs/
    line: int
    lang: str
    code: str
    kind: str = "shown"  # or "check", "after"
    file: str | None = None
    skip: str | None = None
    output: str | None = None  # what the Output block after it shows the block prints

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


OUTPUT = re.compile(r'title="Output"')


def attach_output(found: list[Block], shown: str, where: str) -> None:
    """An Output block belongs to the block just before it, which must be run and shown."""
    block = found[-1] if found else None
    if block is None or block.kind != "shown" or block.lang not in {"python", "sh"}:
        raise AssertionError(f"{where}: an Output block follows the Python or shell block it shows")
    if block.output is not None or block.file or block.skip:
        raise AssertionError(f"{where}: an Output block follows a block that is run")
    found[-1] = replace(block, output=shown)


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)


def blocks(page: Path, docs: Path = DOCS) -> list[Block]:
    text = page.read_text()
    name = page.relative_to(docs).as_posix()
    found: list[Block] = []
    directive: str | None = None
    for match in TOKEN.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match.group("hidden") == "setup":
            raise AssertionError(
                f"docs/{name}:{line}: a hidden setup block: show it on the page, since a reader "
                "who pastes the page's blocks would not have what it sets up"
            )
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
            if OUTPUT.search(match.group("info")):
                attach_output(found, code, f"docs/{name}:{line}")
                directive = None
                continue
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
