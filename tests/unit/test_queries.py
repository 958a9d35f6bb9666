"""Every statement lives in sql/, is named, documented and renders for any valid schema."""

from __future__ import annotations

import re

import pytest
from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH

from pgqueue.errors import PgQueueError
from pgqueue.queries import IN_ALL_ROWS, _raw_queries, migrations, query, sql_root, statement


def test_every_query_has_a_snake_case_entity_verb_name_and_a_description() -> None:
    for path in (sql_root() / "queries").glob("*.sql"):
        text = path.read_text()
        for match in re.finditer(r"^-- name: (\S+)\n(-- .+)?", text, re.MULTILINE):
            assert re.fullmatch(r"[a-z]+_[a-z_]+", match[1]), match[1]
            assert match[2], f"query {match[1]} in {path.name} has no description line"


def test_queries_render_schema_as_a_quoted_identifier() -> None:
    rendered = query("job_claim", "Odd_Schema").as_string(None)
    assert '"Odd_Schema".jobs' in rendered
    assert "{schema}" not in rendered


def test_a_shards_own_tables_replace_the_schemas_in_the_statements_a_node_runs() -> None:
    tables = (("jobs", "jobs_102008"), ("queue_pauses", "queue_pauses_102040"))
    rendered = query("citus_job_claim", "Odd_Schema", tables).as_string(None)
    assert rendered.count('"Odd_Schema"."jobs_102008"') == 2
    assert '"Odd_Schema"."queue_pauses_102040"' in rendered
    assert '"jobs"' not in rendered
    plain = query("citus_job_claim", "Odd_Schema").as_string(None)
    assert plain.count('"Odd_Schema"."jobs"') == 2 and "_102008" not in plain
    assert "shard = %(shard)s" in rendered
    every_row = query("citus_job_claim", "s", (*tables, *IN_ALL_ROWS)).as_string(None)
    assert "shard = %(shard)s" not in every_row and "WHERE true" in every_row
    with pytest.raises(PgQueueError, match="no table placeholder"):
        query("citus_job_claim", "s", (("workers", "workers_1"),))


def test_comments_never_reach_the_server_as_placeholders() -> None:
    for name, body in _raw_queries().items():
        assert not any(line.lstrip().startswith("--") for line in body.splitlines()), name


def test_no_query_has_a_string_literal_across_lines() -> None:
    """statement() drops each line's indentation, which would change such a literal."""
    for name, body in _raw_queries().items():
        for line in body.splitlines():
            assert line.split("--")[0].count("'") % 2 == 0, (name, line)


def test_the_claim_and_the_finish_fit_psycopgs_statement_cache() -> None:
    """A longer statement is parsed and hashed again at every execute, a visible share of
    the worker's time per job."""
    for name in ("job_claim", "job_claim_unkeyed", "job_finish_many"):
        rendered = statement(name, "pgqueue")
        assert isinstance(rendered, bytes)
        assert len(rendered) <= MAX_CACHED_STATEMENT_LENGTH, (name, len(rendered))


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [m.version for m in migrations()]
    assert versions == list(range(1, len(versions) + 1))
