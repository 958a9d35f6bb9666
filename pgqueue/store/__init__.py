"""Typed access to pgqueue's tables: one module per table, one method per named query.

Each module is the only Python that runs the queries of its SQL file (sql/queries/NAME.sql),
on a psycopg connection the caller owns: it never commits, and the caller's transaction is
the statement's. Rows come back as frozen dataclasses through psycopg's row factories, so no
row is read by position outside this package. Times are passed in as an optional `now` that
the SQL uses instead of the clock, so tests can pin time.
"""
