"""The record types, without a database: Enqueued stays an int, filters validate once."""

from __future__ import annotations

import json
import pickle
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from pgqueue import ConfigurationError, Enqueued, JobStatus
from pgqueue.models import QUEUE_NAME, JobFilter
from pgqueue.store.jobs import job_from_row
from pgqueue.wakeup import CANCEL_PREFIX


def test_enqueued_is_the_id_wherever_an_int_was_used() -> None:
    new, found = Enqueued(17), Enqueued(17, created=False)
    assert new == found == 17 and new.created and not found.created
    assert str(found) == "17" and f"{found}" == "17" and json.dumps([found]) == "[17]"
    assert {17: "x"}[found] == "x" and found.id == 17 and type(found.id) is int
    assert repr(found) == "Enqueued(id=17, created=False)"
    copy = pickle.loads(pickle.dumps(found))
    assert copy == 17 and not copy.created


def test_a_record_from_a_row_of_the_old_width_still_decodes() -> None:
    now = datetime.now(timezone.utc)
    row: tuple[Any, ...] = (1, "q", "t", {}, "succeeded", 0, 1, 3, now, now, now)
    row += (now + timedelta(seconds=2),)
    job = job_from_row((*row, 7, [], {"ok": True}))
    assert job.status is JobStatus.SUCCEEDED and job.finished
    assert job.run_time == timedelta(seconds=2) and job.wait_time == timedelta(0)
    assert job.retry_of is None and job.dedupe_key is None and not job.atomic
    dumped = job.model_dump(mode="json")
    assert dumped["run_time"] == "PT2S" and dumped["last_error"] is None


def _statuses(status: Any) -> Any:
    """The statuses a JobFilter built as list_jobs builds it (keywords of any type) sends."""
    filters: dict[str, Any] = {"status": status}
    return JobFilter(**filters).params()["statuses"]


def test_filters_take_one_status_or_several_and_refuse_unknown_ones() -> None:
    assert _statuses("failed") == ["failed"]
    assert _statuses(["queued", JobStatus.RUNNING]) == ["queued", "running"]
    assert JobFilter().params()["statuses"] is None
    with pytest.raises(ConfigurationError, match="status"):
        _statuses("finished")


def test_the_cancel_notification_can_never_be_mistaken_for_a_queue_name() -> None:
    assert not QUEUE_NAME.fullmatch(CANCEL_PREFIX + "12")
