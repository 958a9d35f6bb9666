"""Every example on the documentation pages runs, as written, against a real PostgreSQL.

Each page gets a database and a folder of its own, with PGQUEUE_DSN naming that database, as
the tutorial tells a reader to set it; its Python blocks share one namespace in this process,
its shell blocks run in bash, its SQL blocks on the page's database. tests/docs/blocks.py
says how a block is marked to be written to a file, skipped, or run unseen.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import tomllib
import yaml

from pgqueue import Queue
from pgqueue.migrate import apply
from tests.conftest import database_of_its_own
from tests.docs.blocks import DOCS, READ_ONLY, ROOT, Block, blocks, pages

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


@pytest.fixture
def page_env(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A database of the page's own (migrated, as a reader's would be after `pgqueue
    migrate`), a folder to run in, and the environment the pages tell a reader to set."""
    with database_of_its_own(dsn) as made:
        with psycopg.connect(made, autocommit=True) as conn:
            apply(conn, "pgqueue")
        url = as_url(made)
        monkeypatch.setenv("PGQUEUE_DSN", url)
        monkeypatch.delenv("DATABASE_URL", raising=False)
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        env = {  # on top of os.environ as it is when a shell block runs
            "PGQUEUE_DSN": url,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(tmp_path),
            "COLUMNS": "100",
        }
        namespace: dict[str, Any] = {"__name__": "docs_example"}
        yield {"dsn": url, "folder": tmp_path, "env": env, "namespace": namespace}
        # What the examples opened: queues, connections, engines.
        for value in list(namespace.values()):
            if isinstance(value, (Queue, psycopg.Connection)):
                value.close()
            elif type(value).__name__ == "Engine" and hasattr(value, "dispose"):
                value.dispose()
        namespace.clear()
        for name, module in list(sys.modules.items()):  # the page's own modules go with it
            if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
                del sys.modules[name]


def run_python(block: Block, env: dict[str, Any]) -> None:
    # dont_inherit: the example is compiled as its own module would be, without this file's
    # `from __future__ import annotations` (SQLAlchemy reads its models' annotations).
    code = compile(block.code, block.where, "exec", dont_inherit=True)
    exec(code, env["namespace"])  # the page's own example, run as a reader would


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


def run_shell(block: Block, env: dict[str, Any]) -> None:
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", shell_script(block)],
        cwd=env["folder"], env=os.environ | env["env"], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}\n{block.code}\n--- stdout\n{done.stdout}"
        f"\n--- stderr\n{done.stderr}"
    )


def run_sql(block: Block, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(block.code.encode())


def run_block(block: Block, env: dict[str, Any]) -> None:
    if block.file:
        (env["folder"] / block.file).write_text(block.code)
    elif block.lang == "python":
        run_python(block, env)
    elif block.lang == "sh":
        run_shell(block, env)
    elif block.lang == "sql":
        run_sql(block, env["dsn"])
    elif block.lang == "yaml":
        assert list(yaml.safe_load_all(block.code)), f"{block.where}: empty YAML"
    elif block.lang == "json":
        json.loads(block.code)
    else:
        assert block.lang in READ_ONLY, block.where


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


def test_the_convention_reads_files_skips_and_hidden_setup(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- file: shop.py -->\n```python\nx = 1\n```\n\n"
        "<!-- test: skip serves until stopped, tested elsewhere -->\n"
        "```sh\npgqueue dashboard\n```\n"
        "<!-- test: setup\n```python\ny = 2\n```\n-->\n\n"
        "```sql\nSELECT 1;\n```\n"
    )
    found = [(b.lang, b.kind, b.file, b.skip, b.code) for b in blocks(page, docs=tmp_path)]
    assert found == [
        ("python", "shown", "shop.py", None, "x = 1\n"),
        ("sh", "shown", None, "serves until stopped, tested elsewhere", "pgqueue dashboard\n"),
        ("python", "setup", None, None, "y = 2\n"),
        ("sql", "shown", None, None, "SELECT 1;\n"),
    ]
