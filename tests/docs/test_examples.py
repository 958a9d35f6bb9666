"""Every example on the documentation pages runs, as written, against a real PostgreSQL, and
prints what the page shows it printing.

Each page gets a database and a folder of its own, with PGQUEUE_DSN naming that database, as
the tutorial tells a reader to set it; its Python blocks run in order in one fresh interpreter
of their own (tests/docs/runner.py), its shell blocks in bash, its SQL blocks on the page's
database. Nothing else is set up: a hidden setup block is refused, so what a reader pastes
from a page runs. tests/docs/blocks.py says how a block is marked to be written to a file,
skipped, checked unseen, or compared with the output the page shows.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import select
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import psycopg
import pytest
import tomllib
import yaml

from pgqueue import Queue
from pgqueue.migrate import apply
from tests.conftest import database_of_its_own
from tests.docs.blocks import DOCS, READ_ONLY, ROOT, Block, blocks, pages

RUNNER = Path(__file__).with_name("runner.py")
BLOCK_TIMEOUT = 120  # seconds a block may take

PAGES = [p.relative_to(DOCS).as_posix() for p in pages()]
EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
PIP_INSTALL = re.compile(r"^pip install (?P<args>.*?)(\s+#.*)?$")
EXPORT_DSN = re.compile(r"^export PGQUEUE_DSN=(?P<value>\S+)")


def as_url(conninfo: str) -> str:
    """The DSN as a postgresql:// URL, the form the pages (and SQLAlchemy) use; a socket
    directory goes in the query string."""
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    host = str(info.get("host", ""))
    query = []
    if host.startswith("/"):
        query.append(f"host={quote(host, safe='/')}")
        host = ""
    netloc = f"{info.get('user', '')}@{host}" if info.get("user") else host
    if info.get("port"):
        if host:
            netloc += f":{info['port']}"
        else:
            query.append(f"port={info['port']}")
    url = f"postgresql://{netloc}/{info['dbname']}"
    return url + ("?" + "&".join(query) if query else "")


def reads_pgqueue_dsn() -> bool:
    old = os.environ.get("PGQUEUE_DSN")
    os.environ["PGQUEUE_DSN"] = "postgresql://nobody@127.0.0.1:1/none"
    try:
        return Queue().dsn is not None
    finally:
        if old is None:
            del os.environ["PGQUEUE_DSN"]
        else:
            os.environ["PGQUEUE_DSN"] = old


class Interpreter:
    """The fresh Python a reader pastes a page's blocks into: tests/docs/runner.py, in the
    page's folder, with the page's environment."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        read, write = os.pipe()
        self.log: IO[str] = (folder / ".interpreter.log").open("w+")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-u", str(RUNNER), str(write)],
                cwd=folder, env=os.environ | env, stdin=subprocess.PIPE, stdout=self.log,
                stderr=subprocess.STDOUT, pass_fds=(write,), text=True,
            )  # fmt: skip
        finally:
            os.close(write)
        self.replies = os.fdopen(read)

    def run(self, block: Block) -> str:
        """What the block printed; a failure if it raised."""
        assert self.process.stdin is not None
        request = {"code": block.code, "where": block.where, "kind": block.kind}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.replies], [], [], BLOCK_TIMEOUT)
        line = self.replies.readline() if ready else ""
        if not line:
            pytest.fail(f"{block.where} did not finish in {BLOCK_TIMEOUT} s\n{self.output()}")
        reply = json.loads(line)
        if reply["error"]:
            pytest.fail(f"{block.where} raised\n{block.code}\n{reply['error']}\n{self.output()}")
        return str(reply["stdout"])

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return "--- the interpreter's own output\n" + self.log.read()[-4000:]

    def close(self) -> None:
        """Ends the interpreter as a reader's ends, its threads joined; killed if it hangs."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.replies.close()
        self.log.close()


@contextmanager
def interpreter(folder: Path, env: dict[str, str]) -> Iterator[Interpreter]:
    python = Interpreter(folder, env)
    try:
        yield python
    finally:
        python.close()


@pytest.fixture
def page_env(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A database of the page's own (migrated, as a reader's would be after `pgqueue
    migrate`), a folder to run in, the environment the pages tell a reader to set, and a fresh
    interpreter there, ended before the database is dropped."""
    with database_of_its_own(dsn) as made:
        with psycopg.connect(made, autocommit=True) as conn:
            apply(conn, "pgqueue")
        url = as_url(made)
        monkeypatch.setenv("PGQUEUE_DSN", url)
        monkeypatch.delenv("DATABASE_URL", raising=False)
        monkeypatch.chdir(tmp_path)
        python_path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
        env = {  # on top of os.environ as it is when a block runs
            "PGQUEUE_DSN": url,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": python_path,
            "COLUMNS": "100",
        }
        with interpreter(tmp_path, env) as python:
            yield {"dsn": url, "folder": tmp_path, "env": env, "python": python}


def shell_script(block: Block) -> str:
    """The block as bash runs it: `pip install` lines are checked, not run (the extras they
    name must exist: this checkout is installed already), and `export PGQUEUE_DSN=...` keeps
    the page's database."""
    lines = []
    for line in block.code.splitlines():
        install = PIP_INSTALL.match(line.strip())
        export = EXPORT_DSN.match(line.strip())
        if install:
            for extra_list in re.findall(r"\[([\w,-]+)\]", install.group("args")):
                unknown = set(extra_list.split(",")) - EXTRAS
                assert not unknown, f"{block.where}: no extra {sorted(unknown)} in pyproject.toml"
            assert "-e" in shlex.split(install.group("args")) or "pgqueue-py" in line, (
                f"{block.where}: install from the checkout (-e) or as pgqueue-py"
            )
        elif export:
            assert export.group("value").startswith("postgresql://"), block.where
        else:
            lines.append(line)
    return "\n".join(lines)


def run_shell(block: Block, env: dict[str, Any]) -> str:
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", shell_script(block)],
        cwd=env["folder"], env=os.environ | env["env"], capture_output=True, text=True,
        timeout=BLOCK_TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}\n{block.code}\n--- stdout\n{done.stdout}"
        f"\n--- stderr\n{done.stderr}"
    )
    return done.stdout


def run_sql(block: Block, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(block.code.encode())


def run_block(block: Block, env: dict[str, Any]) -> None:
    printed = None
    if block.file:
        (env["folder"] / block.file).write_text(block.code)
    elif block.lang == "python":
        printed = env["python"].run(block)
    elif block.lang == "sh":
        printed = run_shell(block, env)
    elif block.lang == "sql":
        run_sql(block, env["dsn"])
    elif block.lang == "yaml":
        assert list(yaml.safe_load_all(block.code)), f"{block.where}: empty YAML"
    elif block.lang == "json":
        json.loads(block.code)
    else:
        assert block.lang in READ_ONLY, block.where
    if block.output is not None:
        assert shows(block.output, printed or ""), (
            f"{block.where} prints what its Output block does not show\n--- shown\n"
            f"{block.output}--- printed\n{printed}"
        )


def shows(shown: str, printed: str) -> bool:
    """The output a page shows is the output printed, line for line; `...` stands for any
    text (an id, a time), as in a doctest."""
    return doctest.OutputChecker().check_output(
        shown.rstrip() + "\n", printed.rstrip() + "\n", doctest.ELLIPSIS
    )


@pytest.mark.parametrize("page", PAGES)
def test_every_example_on_the_page_runs(page: str, dsn: str, page_env: dict[str, Any]) -> None:
    found = blocks(DOCS / page)
    if any(b.lang == "python" and "Queue()" in b.code for b in found) and not reads_pgqueue_dsn():
        pytest.skip("this checkout's Queue() does not read PGQUEUE_DSN yet; the pages use it")
    after = [b for b in found if b.kind == "after"]
    try:
        for block in found:
            if block.kind == "after" or block.skip:
                continue
            run_block(block, page_env)
    finally:
        if after:
            for block in after:
                run_sql_after(block, dsn, page_env["dsn"])


def run_sql_after(block: Block, admin_dsn: str, page_dsn: str) -> None:
    """The page's database goes first: what the page granted to its roles goes with it."""
    dbname = psycopg.conninfo.conninfo_to_dict(page_dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(str(dbname))
            )
        )
        conn.execute(block.code.encode())


def test_skips_are_explicit_and_rare() -> None:
    runnable = [b for p in pages() for b in blocks(p) if b.lang in {"python", "sh", "sql"}]
    skipped = [b for b in runnable if b.skip]
    assert all(len(b.skip or "") > 20 for b in skipped), "each skip says what runs it instead"
    assert len(skipped) <= len(runnable) // 5, [b.where for b in skipped]


def test_the_convention_reads_files_skips_checks_and_output(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- file: shop.py -->\n```python\nx = 1\n```\n\n"
        "<!-- test: skip serves until stopped, tested elsewhere -->\n"
        "```sh\npgqueue dashboard\n```\n"
        "```python\nprint(x)\n```\n\n"
        '```text title="Output"\n1\n```\n\n'
        "<!-- test: check\n```python\nassert x == 1\n```\n-->\n\n"
        "```sql\nSELECT 1;\n```\n"
    )
    found = [
        (b.lang, b.kind, b.file, b.skip, b.code, b.output) for b in blocks(page, docs=tmp_path)
    ]
    assert found == [
        ("python", "shown", "shop.py", None, "x = 1\n", None),
        ("sh", "shown", None, "serves until stopped, tested elsewhere", "pgqueue dashboard\n",
         None),
        ("python", "shown", None, None, "print(x)\n", "1\n"),
        ("python", "check", None, None, "assert x == 1\n", None),
        ("sql", "shown", None, None, "SELECT 1;\n", None),
    ]  # fmt: skip


def test_a_hidden_setup_block_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- test: setup\n```python\nconn = 1\n```\n-->\n\n```python\nconn\n```\n")
    with pytest.raises(AssertionError, match="hidden setup block: show it"):
        blocks(page, docs=tmp_path)


def test_an_output_block_shows_the_block_before_it(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('```yaml\na: 1\n```\n\n```text title="Output"\na\n```\n')
    with pytest.raises(AssertionError, match="follows the Python or shell block it shows"):
        blocks(page, docs=tmp_path)


def test_shown_output_must_be_what_is_printed() -> None:
    assert shows("{'rows': 42, 'month': '2026-10'}\n", "{'rows': 42, 'month': '2026-10'}\n")
    assert not shows("{'month': '2026-10', 'rows': 42}\n", "{'rows': 42, 'month': '2026-10'}\n")
    assert shows("job ... finished\n", "job 17 finished\n")
    assert not shows("1\n", "1\n2\n")


def test_a_page_runs_in_a_fresh_interpreter_where_checks_define_nothing(tmp_path: Path) -> None:
    def block(code: str, kind: str = "shown") -> Block:
        return Block("page.md", 1, "python", code, kind=kind)

    with interpreter(tmp_path, {"PYTHONPATH": str(tmp_path)}) as python:
        assert python.run(block("import sys\nprint(__name__, 'pytest' in sys.modules)")) == (
            "__main__ False\n"
        )
        python.run(block("import os\nfound = 1", kind="check"))
        assert python.run(block("print('os' in globals(), 'found' in globals())")) == (
            "False False\n"
        )
        with pytest.raises(pytest.fail.Exception, match="NameError: name 'found'"):
            python.run(block("found"))


# A comment after a print that starts like a value (a dict, a list, a string, a number, a dotted
# name, True/False/None) is output shown where nothing compares it: it goes in an Output block.
OUTPUT_IN_A_COMMENT = re.compile(
    r"^\s*print\(.*\)\s*#\s*([{\[('\"\d]|(True|False|None)\b|\w+\.\w+)"
)


def test_no_page_shows_output_in_a_comment() -> None:
    found = [
        f"{b.where}: {line.strip()}"
        for p in pages()
        for b in blocks(p)
        if b.lang == "python"
        for line in b.code.splitlines()
        if OUTPUT_IN_A_COMMENT.match(line)
    ]
    assert not found, "show output in an Output block, which the test compares:\n" + "\n".join(
        found
    )
