"""The lean round's shape, read from real histories on the dev server (docs/ARCHITECTURE.md,
"The round").

A new round runs slice (and tune, on a theme-cache miss) as activities and its one store step
(index, select, publish) as a local activity: its history holds the slice's events, one marker,
and one search-attribute upsert that records the theme and the outcome together. Its result
carries only the picked lines of the scoring log. Rounds recorded before the lean shape still
replay (tests/replay, classic shape); these histories replay too, and are committed with
MNEMOFLOW_RECORD_REPLAY=1.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter

from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models import search_attributes as sa
from mnemoflow.models.contracts import ActivityName, RoundInput, RoundResult, UserStatus
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.workflows.memory_round import LEAN_SHAPE
from mnemoflow.workflows.user_rounds import ROUND_SHAPE
from tests.support.drive import conversation, status, submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.replay import assert_replays

HOUR = 3600.0
LINES = [
    "Hello, my name is Ada and I work as a nurse in Leeds.",
    "Welcome Ada! What can I do for you today?",
    "My order number is 55120 and the parcel is late.",
    "Let me look up order 55120.",
    "I love gardening and I prefer text messages to calls.",
    "Got it, texts it is.",
]


def _markers(history: WorkflowHistory) -> list[str]:
    return [
        e.marker_recorded_event_attributes.marker_name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
    ]


async def test_lean_round_has_few_events_one_upsert_and_a_slim_result(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"lean-{uuid.uuid4().hex[:8]}"
        turns = conversation("t", LINES, time.time() - 3 * HOUR)
        for part in (turns[:4], turns[4:]):
            handle = await submit(client, mw.task_queue, user, part, urgent=True)
            end = part[-1].position + 1

            def indexed(s: UserStatus, end: int = end) -> bool:
                return s.watermarks["t"].indexed >= end

            await wait_status(handle, indexed, deadline_s=60, what="round indexed")
        rounds = (await status(handle)).rounds
        assert [r.status for r in rounds] == ["completed", "completed"]
        for record in rounds:
            round_handle = client.get_workflow_handle(record.workflow_id, result_type=RoundResult)
            history = await round_handle.fetch_history()
            kinds = Counter(e.event_type for e in history.events)
            activities = [
                e.activity_task_scheduled_event_attributes.activity_type.name
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            ]
            # Through the server: the slice, and a tune per theme-cache miss; nothing else.
            assert activities[0] == ActivityName.SLICE, activities
            assert set(activities[1:]) <= {ActivityName.TUNE}, activities
            # The store step ran as one local activity: one marker.
            assert _markers(history) == ["core_local_activity"]
            assert kinds[EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES] == 1
            tasks = kinds[EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED]
            assert tasks == 1 + len(activities), kinds
            # started, workflow tasks and activities (3 events each), marker, upsert, completed
            assert len(history.events) == 4 + 3 * tasks + 3 * len(activities), kinds
            desc = await round_handle.describe()
            attrs = desc.typed_search_attributes
            assert attrs.get(sa.OUTCOME) == "completed"
            assert attrs.get(sa.THEME), "the round's theme was not recorded"
            result = await round_handle.result()
            assert result.selection is not None and result.context.fragments
            assert all(c.picked for c in result.selection.candidates)
            assert {c.fragment_id for c in result.selection.candidates} <= {
                f.id for f in result.context.fragments
            }
        assert await assert_replays(client, [user_workflow_id(user)], name="lean-user") == 1
        ids = [r.workflow_id for r in rounds]
        assert await assert_replays(client, ids, name="round-lean") == len(ids)


def test_new_rounds_are_lean_and_old_inputs_classic() -> None:
    """The user workflow starts lean rounds; an input without `shape` (every round recorded
    before it, replayed by tests/workflows/test_replay.py) is classic."""
    assert ROUND_SHAPE >= LEAN_SHAPE
    assert RoundInput.model_validate(
        {"user_id": "u", "round_no": 1, "event_id": "e", "thread_id": "t", "turns": [],
         "first_seq": 1}
    ).shape < LEAN_SHAPE  # fmt: skip
