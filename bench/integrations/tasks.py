"""The django.tasks task of bench/integrations/suite.py: defined once Django is set up, since
the decorator asks the configured backend to check it."""

from __future__ import annotations

from django.tasks import task


@task()
def noop(i: int) -> None:
    """Never run: no worker runs in that bench."""
