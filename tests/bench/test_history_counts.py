"""What benchmarks/throughput.py counts in a history: a local activity that the worker retried
within one workflow task leaves a single marker, whose recorded attempt is the only trace of
the attempts before it (they timed out or failed, and their work was done again)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from temporalio.api.common.v1 import Payload, Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import History, HistoryEvent, MarkerRecordedEventAttributes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import throughput


def _marker(event_id: int, attempt: int | None, *, data: bytes | None = None) -> HistoryEvent:
    if data is None:
        fields = {"seq": event_id, "activity_type": "mnemoflow.store_round"}
        if attempt is not None:
            fields["attempt"] = attempt
        data = json.dumps(fields).encode()
    details = {
        "data": Payloads(payloads=[Payload(metadata={"encoding": b"json/plain"}, data=data)])
    }
    return HistoryEvent(
        event_id=event_id,
        event_type=EventType.EVENT_TYPE_MARKER_RECORDED,
        marker_recorded_event_attributes=MarkerRecordedEventAttributes(
            marker_name=throughput.LOCAL_ACTIVITY_MARKER, details=details
        ),
    )


def test_local_attempts_past_the_first_are_counted_from_the_markers() -> None:
    history = History(
        events=[
            HistoryEvent(event_id=1, event_type=EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED),
            _marker(2, 1),
            _marker(3, 3),  # two attempts timed out before this one succeeded
            _marker(4, None),  # no attempt recorded: counted as a first attempt
            _marker(5, None, data=b"not json"),  # unreadable: the same, nothing raised
        ]
    )
    figures = throughput.history_figures(history)
    assert figures["markers"] == 4
    assert figures["local_activity_retries"] == 2
    assert figures["local_activity_failures"] == 0
