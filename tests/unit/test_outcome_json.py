"""An outcome's JSON for job_finish_many: a plain success, formatted directly, says what the
full row says, as the statement reads it (a missing key as null)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pgqueue.models import ClaimedJob
from pgqueue.worker.outcome import Outcome

JOB = ClaimedJob(9_007_199_254_740_993, "t", {}, 0, 3, 5, "default", 2**40 + 7)
DEFAULTS: dict[str, Any] = {"error": None, "result": None, "retry_in": 0.0, "snooze": False}


def _as_read(row: dict[str, Any]) -> dict[str, Any]:
    """The row as the statement sees it: null and default keys as if absent."""
    return {k: v for k, v in row.items() if v is not None and DEFAULTS.get(k, object()) != v}


@pytest.mark.parametrize("duration", [0.0, 1.234567e-05, 0.0000004999, 3.5, 86_400.000_000_6])
def test_a_plain_success_reads_as_its_full_row_to_the_microsecond(duration: float) -> None:
    outcome = Outcome(JOB, "succeeded", duration)
    short = json.loads(outcome.as_json())
    full = _as_read(outcome.as_row())
    assert short.pop("duration") == pytest.approx(full.pop("duration"), abs=5e-7)
    assert short == full


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome(JOB, "succeeded", 0.5, result={"n": 1}),
        Outcome(JOB, "succeeded", 0.5, progress={"fraction": 1.0}),
        Outcome(JOB, "succeeded", None),
        Outcome(JOB, "retry", 0.5, error={"error": "x"}, retry_in=2.0),
        Outcome(JOB, "retry", 0.5, retry_in=0.0, snooze=True),
        Outcome(JOB, "failed", 0.5, error={"error": "x"}),
    ],
)
def test_any_other_outcome_is_its_full_row(outcome: Outcome) -> None:
    assert json.loads(outcome.as_json()) == outcome.as_row()
