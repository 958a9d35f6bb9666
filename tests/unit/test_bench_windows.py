"""The degradation bench's windows (bench/degradation/windows.py) attribute each statement
pg_stat_statements reports to the kind of work its sql/queries name belongs to."""

from __future__ import annotations

from bench.degradation.windows import KINDS, shape
from pgqueue.queries import _raw_queries, query

SCHEMA = "bench_schema"


def test_every_statement_a_kind_names_has_a_shape_no_other_statement_has() -> None:
    shapes: dict[str, list[str]] = {}
    for name in _raw_queries():
        if name.startswith("grant_"):
            continue  # rendered for a role too (queries.grant), never run by a worker
        text = query(name, SCHEMA).as_string(None)
        shapes.setdefault(shape(text), []).append(name)
    named = [name for names in KINDS.values() for name in names]
    shared = {n: found for n in named for found in shapes.values() if n in found and len(found) > 1}
    assert shared == {}
    assert all(any(n in found for found in shapes.values()) for n in named)


def test_a_shape_ignores_what_pg_stat_statements_replaces_by_placeholders() -> None:
    ours = "SELECT a FROM t WHERE b = %(b)s AND c = 'x' AND d IN (1, 2, 3)\n  LIMIT 10;"
    kept = "SELECT a FROM t WHERE b = $1 AND c = $2 AND d IN ($3 /*, ... */) LIMIT $4"
    assert shape(ours) == shape(kept)
    assert shape(ours) != shape(ours.replace("c =", "e ="))
