"""The round's shape, read from real histories on the dev server (docs/ARCHITECTURE.md,
"The round").

A round of shape 3 or 4 makes its LLM calls (slice, and tune on a theme-cache miss) as one local
attempt and its store step (index, select, publish) as a local activity: its history holds two
markers, one search-attribute upsert that records the theme and the outcome together, and one
workflow task. A local LLM attempt that fails or runs past its bound hands the calls it did not
make to the ordinary activities, and a success is never repeated. Its payloads are bounded: the
result names the published fragments by id and carries only the contents the user workflow does
not hold (shape 3) or only those of the round's own fragments (shape 4).
Rounds recorded before (shapes 1 and 2, tests/replay) still replay; these histories replay too,
and are committed with MNEMOFLOW_RECORD_REPLAY=1 (round-slim-*, slim-user-*; shape 2:
round-shape2-*, shape2-user-*).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from datetime import timedelta

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models import search_attributes as sa
from mnemoflow.models.contracts import ActivityName, RoundInput, RoundResult
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.round_store import full_id, unpack_params
from mnemoflow.workflows import options
from mnemoflow.workflows.memory_round import LEAN_SHAPE, LOCAL_LLM_SHAPE
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from mnemoflow.workflows.user_rounds import ROUND_SHAPE
from tests.support.drive import conversation, rounds_done, status
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


def _activities(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def _round_input(history: WorkflowHistory) -> RoundInput:
    from temporalio.contrib.pydantic import pydantic_data_converter

    started = history.events[0].workflow_execution_started_event_attributes
    [inp] = pydantic_data_converter.payload_converter.from_payloads(
        list(started.input.payloads), [RoundInput]
    )
    return inp


async def test_round_is_local_steps_one_task_one_upsert_and_bounded_payloads(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shape 3 (rounds started before shape 4, still running on a deploy; shape 4 keeps its
    steps and adds references: tests/workflows/test_round_by_reference.py)."""
    from mnemoflow.workflows import user_rounds

    monkeypatch.setattr(user_rounds, "ROUND_SHAPE", LOCAL_LLM_SHAPE)  # the sandbox shares it
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"slim-{uuid.uuid4().hex[:8]}"
        turns = conversation("t", LINES, time.time() - 3 * HOUR)
        handle = await rounds_done(client, mw.task_queue, user, [turns[:2], turns[2:4], turns[4:]])
        rounds = (await status(handle)).rounds
        assert [r.status for r in rounds] == ["completed"] * 3
        inputs: list[RoundInput] = []
        for record in rounds:
            round_handle = client.get_workflow_handle(record.workflow_id, result_type=RoundResult)
            history = await round_handle.fetch_history()
            kinds = Counter(e.event_type for e in history.events)
            # Nothing through the server's activity queues: slice, tunes and the store step
            # each left one marker.
            assert _activities(history) == []
            markers = _markers(history)
            # one for slice and tune, one for the store step
            assert markers == ["core_local_activity"] * 2
            assert kinds[EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES] == 1
            assert kinds[EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED] == 1, kinds
            # started, one workflow task (3 events), the markers, the upsert, completed
            assert len(history.events) == 1 + 3 + len(markers) + 1 + 1, kinds
            attrs = (await round_handle.describe()).typed_search_attributes
            assert attrs.get(sa.OUTCOME) == "completed"
            assert attrs.get(sa.THEME), "the round's theme was not recorded"
            inp = _round_input(history)
            assert inp.shape == LOCAL_LLM_SHAPE
            inputs.append(inp)
            result = await round_handle.result()
            assert result.ranked, "the published selection is named in the result"
            assert result.selection is not None and result.selection.candidates == []
            # Only contents the user workflow did not hold come back; ids travel short.
            ranked = [full_id(user, r.id) for r in result.ranked]
            held_ids = {full_id(user, i) for i in inp.known_fragments}
            assert all(r.id.startswith("~") for r in result.ranked)
            assert not {f.id for f in result.context.fragments} & held_ids
            assert {f.id for f in result.context.fragments} <= set(ranked)
        # Each round is told which published fragments the user workflow holds: the previous
        # round's selection; the weights it gets are bounded.
        for before, after in zip(rounds, inputs[1:], strict=False):
            prev = await client.get_workflow_handle(
                before.workflow_id, result_type=RoundResult
            ).result()
            assert after.known_fragments == [r.id for r in prev.ranked or []]
        # and the whole theme cache (so a cached theme is never tuned again).
        results = [
            await client.get_workflow_handle(r.workflow_id, result_type=RoundResult).result()
            for r in rounds
        ]
        for i, inp in enumerate(inputs):
            assert not inp.tuned  # packed instead
            assert set(inp.tuned_packed) == {k for r in results[:i] for k in r.tuned_new}
            assert not set(results[i].tuned_new) & set(inp.tuned_packed)
            for key, values in inp.tuned_packed.items():
                sent = unpack_params(values).model_dump()
                had = next(r.tuned_new[key] for r in results if key in r.tuned_new)
                assert sent == pytest.approx(had.model_dump(), abs=1e-6)
        # The user workflow put the selection together again: what it holds is what Redis got.
        held = await handle.query(UserMemoryWorkflow.context)
        published = await mw.read_model.get(user)
        assert published is not None and held.fragments
        assert [(f.id, f.content, round(f.score, 6)) for f in held.fragments] == [
            (f.id, f.content, round(f.score, 6)) for f in published.fragments
        ]
        assert all(f.content for f in held.fragments)
        assert await assert_replays(client, [user_workflow_id(user)], name="slim-user") == 1
        ids = [r.workflow_id for r in rounds]
        assert await assert_replays(client, ids, name="round-slim") == len(ids)


async def test_shape_2_rounds_still_run_as_before(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds of shape 2 (started before shape 3, still running on a deploy) keep their shape:
    slice and tune as activities, one marker, the whole selection in the result."""
    from mnemoflow.workflows import user_rounds

    monkeypatch.setattr(user_rounds, "ROUND_SHAPE", LEAN_SHAPE)  # the sandbox shares it
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"lean-{uuid.uuid4().hex[:8]}"
        turns = conversation("t", LINES, time.time() - 3 * HOUR)
        handle = await rounds_done(client, mw.task_queue, user, [turns[:4], turns[4:]])
        rounds = (await status(handle)).rounds
        assert [r.status for r in rounds] == ["completed", "completed"]
        for record in rounds:
            round_handle = client.get_workflow_handle(record.workflow_id, result_type=RoundResult)
            history = await round_handle.fetch_history()
            assert _round_input(history).shape == LEAN_SHAPE
            activities = _activities(history)
            assert activities[0] == ActivityName.SLICE, activities
            assert set(activities[1:]) <= {ActivityName.TUNE}, activities
            assert _markers(history) == ["core_local_activity"]
            result = await round_handle.result()
            assert result.ranked is None and result.context.fragments
            assert result.selection is not None and result.selection.candidates
        held = await handle.query(UserMemoryWorkflow.context)
        assert held.fragments and all(f.content for f in held.fragments)
        assert await assert_replays(client, [user_workflow_id(user)], name="shape2-user") == 1
        ids = [r.workflow_id for r in rounds]
        assert await assert_replays(client, ids, name="round-shape2") == len(ids)


class FlakyModels(HeuristicMemoryModels):
    """The offline models whose first slice (or tune) call fails, or hangs for `hang_s`:
    counts the calls of each that started and that succeeded."""

    def __init__(self, step: str, *, hang_s: float = 0.0) -> None:
        super().__init__()
        self.step = step
        self.hang_s = hang_s
        self.started: Counter[str] = Counter()
        self.succeeded: Counter[str] = Counter()

    async def _maybe_fail(self, step: str) -> None:
        self.started[step] += 1
        if step == self.step and self.started[step] == 1:
            if self.hang_s:
                await asyncio.sleep(self.hang_s)
            raise ConnectionError("LLM unreachable (test)")

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        await self._maybe_fail("slice")
        out = await super().slice(turns, max_fragments)
        self.succeeded["slice"] += 1
        return out

    async def tune(self, theme, samples, types):  # type: ignore[no-untyped-def]
        await self._maybe_fail("tune")
        out = await super().tune(theme, samples, types)
        self.succeeded["tune"] += 1
        return out


def _started_attempts(history: WorkflowHistory, name: str) -> list[int]:
    scheduled = {
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == name
    }
    return [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        and e.activity_task_started_event_attributes.scheduled_event_id in scheduled
    ]


@pytest.mark.parametrize(
    ("step", "fault"), [("slice", "fails"), ("slice", "hangs"), ("tune", "fails")]
)
async def test_llm_failing_locally_goes_on_as_the_ordinary_activity_once(
    step: str,
    fault: str,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The local slice-and-tune attempt fails in its slice (or runs past its bound): the
    ordinary slice activity makes the call, then the tunes go as activities. A tune that fails
    in the local step after its slice succeeded leaves the slice alone: only the tune goes on
    as an activity. No call that succeeded is made again."""
    # The sandbox shares this module (imports passed through): a short bound for the test.
    monkeypatch.setattr(options, "LOCAL_LLM_BOUND", timedelta(seconds=2))
    models = FlakyModels(step, hang_s=30.0 if fault == "hangs" else 0.0)
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = f"flaky-{uuid.uuid4().hex[:8]}"
        turns = conversation("t", LINES, time.time() - 3 * HOUR)
        handle = await rounds_done(client, mw.task_queue, user, [turns])
        done = await status(handle)
        assert done.rounds_completed == 1 and done.rounds_failed == 0
        round_handle = client.get_workflow_handle(
            done.rounds[-1].workflow_id, result_type=RoundResult
        )
        history = await round_handle.fetch_history()
        result = await round_handle.result()
        tunes = len(result.tuned_new)
        assert tunes >= 1
        # Each call succeeded once; the failed one was made once more, by an activity whose
        # first attempt succeeded.
        assert models.succeeded == Counter({"slice": 1, "tune": tunes})
        assert models.started == models.succeeded + Counter({step: 1})
        activities = _activities(history)
        if step == "slice":
            assert activities == [ActivityName.SLICE] + [ActivityName.TUNE] * tunes
        else:
            assert ActivityName.SLICE not in activities and ActivityName.TUNE in activities
        assert set(_started_attempts(history, ActivityName.SLICE)) <= {1}
        assert set(_started_attempts(history, ActivityName.TUNE)) <= {1}
        assert await mw.store.count(user) == len(result.fragments)
        name = f"round-slim-{step}-{fault}"
        assert await assert_replays(client, [r.workflow_id for r in done.rounds], name=name) == 1


def test_new_rounds_are_slim_and_old_inputs_classic() -> None:
    """The user workflow starts shape-4 rounds; an input without `shape` (every round recorded
    before the lean shape, replayed by tests/workflows/test_replay.py) is classic."""
    assert ROUND_SHAPE >= LOCAL_LLM_SHAPE > LEAN_SHAPE
    assert RoundInput.model_validate(
        {"user_id": "u", "round_no": 1, "event_id": "e", "thread_id": "t", "turns": [],
         "first_seq": 1}
    ).shape < LEAN_SHAPE  # fmt: skip


def test_a_round_takes_at_most_its_byte_bound_and_always_one_turn() -> None:
    from mnemoflow.models.contracts import UserMemoryInput
    from mnemoflow.models.turns import ChatTurn
    from mnemoflow.workflows import user_rounds
    from mnemoflow.workflows.user_state import UserRun

    def turn(k: int, size: int) -> ChatTurn:
        return ChatTurn(thread_id="t", position=k, role="human", content="😀" * size, time=1.0)

    # A run under RULES_PATCH takes the patch as applied: nothing asks the workflow.
    run = UserRun.start(UserMemoryInput(user_id="u"))
    run.rules = True
    small = [turn(k, 100) for k in range(64)]
    assert user_rounds.within_round_bytes(run, small) == small  # under the bound
    huge = [turn(0, 200_000)]  # one turn over the bound on its own still makes a round
    assert user_rounds.within_round_bytes(run, huge) == huge
    cut = user_rounds.within_round_bytes(run, [turn(k, 60_000) for k in range(4)])
    assert 1 <= len(cut) < 4
