"""The built CLI reference page says exactly what `pgqueue --help` and each subcommand's
`--help` print: the command run as a user runs it, against the page `make docs` wrote."""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pgqueue.cli import parser as cli_parser
from tests.docs.blocks import ROOT

PAGE = ROOT / "site" / "reference" / "cli" / "index.html"
if not PAGE.exists():
    pytest.skip("the documentation site is not built: run `make docs`", allow_module_level=True)
COLUMNS = "100"  # the width docs/_hooks/reference.py renders the help at
PGQUEUE = Path(sys.executable).parent / "pgqueue"


def commands() -> list[list[str]]:
    """Every command line the parser knows: [], ["migrate"], ["jobs"], ["jobs", "list"] ..."""

    def walk(path: list[str], p: argparse.ArgumentParser) -> list[list[str]]:
        found = [path]
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += walk([*path, name], sub)
        return found

    return walk([], cli_parser.build())


def page_blocks() -> dict[str, str]:
    """The page's help texts, by the heading above each: `pgqueue jobs list` -> its text."""
    text = PAGE.read_text()
    found = {}
    for match in re.finditer(
        r"<h[23][^>]*><code>(?P<name>pgqueue[^<]*)</code>.*?<pre>(?P<pre>.*?)</pre>", text, re.S
    ):
        block = html.unescape(re.sub(r"<[^>]+>", "", match.group("pre")))
        found[match.group("name")] = block.strip()
    return found


def help_of(command: list[str]) -> str:
    done = subprocess.run(
        [str(PGQUEUE), *command, "--help"],
        env=os.environ | {"COLUMNS": COLUMNS}, capture_output=True, text=True, timeout=60,
        cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_page_has_a_section_for_every_command_and_no_other() -> None:
    expected = {" ".join(["pgqueue", *command]) for command in commands()}
    assert set(page_blocks()) == expected


@pytest.mark.parametrize("command", commands(), ids=lambda c: " ".join(c) or "pgqueue")
def test_the_page_shows_what_help_prints(command: list[str]) -> None:
    name = " ".join(["pgqueue", *command])
    assert page_blocks()[name] == help_of(command)
