"""The small apps and helpers that tests run as real processes (`python -m tests.apps.NAME`,
`pgqueue worker tests.apps.tasks:queue`) or start beside them (PgBouncer)."""
