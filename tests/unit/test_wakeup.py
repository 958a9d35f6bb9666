"""The wake-up channel's payloads, as pgqueue/wakeup.py reads them."""

from __future__ import annotations

import pytest

from pgqueue.wakeup import CancelRequest, PauseChange, Wake, parse


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("mail -5 42", Wake("mail", (-5, 42))),
        ("mail", Wake("mail", None)),
        ("mail x y", Wake("mail", None)),
        ("!cancel 17", CancelRequest(17)),
        ("!cancel", None),
        ("!cancel 1; drop", None),
        ("!pause mail", PauseChange("mail", True)),
        ("!resume mail", PauseChange("mail", False)),
        ("!pause ", None),
        ("!pause a b", None),
        ("!stop mail", None),
        ("", None),
        (" 1 2", None),
    ],
)
def test_each_payload_reads_as_what_its_sender_meant(
    payload: str, expected: Wake | CancelRequest | PauseChange | None
) -> None:
    assert parse(payload) == expected
