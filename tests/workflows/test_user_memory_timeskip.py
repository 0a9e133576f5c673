"""UserMemoryWorkflow on the time-skipping server, with the real activities, Milvus and Redis.

Workflow time jumps over the maturity timers and retry back-offs, so hours of workflow time run
in seconds; the stores and offline memory models are the real ones.
"""

from __future__ import annotations

import uuid

from temporalio import activity
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.base import validate_drafts
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.memory.formulas import time_to_maturity
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.ids import user_workflow_id
from tests.support.drive import conversation, status, submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.replay import assert_replays

CFG = MemoryConfig.from_vocation("customer service")
LINES = [
    "Hi, my name is Ada Lovelace and I work as a data engineer.",
    "Nice to meet you Ada, how can I help?",
    "My order number is 7734-221 and it has not arrived yet.",
    "I am checking order 7734-221 for you now.",
    "I prefer email over phone calls, and I am busy on Wednesdays.",
    "Noted: email, and not on Wednesdays.",
]


def new_user() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


async def test_round_waits_for_slice_gate_and_induction_for_long_term_gate(
    time_skipping_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    env = time_skipping_env
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = new_user()
        t0 = (await env.get_current_time()).timestamp()
        turns = conversation("thread-1", LINES, t0, step=0.0)
        handle = await submit(env.client, mw.task_queue, user, turns)

        await env.sleep(14 * 60)
        assert (await status(handle)).rounds_started == 0, "round started before the slice gate"
        await env.sleep(60)
        done = await wait_status(
            handle, lambda s: s.rounds_completed == 1, env=env, what="first round"
        )
        assert done.watermarks["thread-1"].indexed == len(LINES)
        stored = await mw.store.count(user)
        assert stored == done.rounds[-1].fragments > 0
        assert done.inductions == 0 and done.induction_cursor == 0

        gate = time_to_maturity(CFG.long_term_gate, CFG.tau_m, CFG.c_m)
        now = (await env.get_current_time()).timestamp()
        await env.sleep(t0 + gate - 60 - now)
        before = await status(handle)
        assert before.inductions == 0, "induction ran before the long-term gate"
        await env.sleep(120)
        after = await wait_status(handle, lambda s: s.inductions >= 1, env=env, what="induction")
        assert after.induction_cursor >= before.induction_cursor
        assert after.induction_cursor == after.rounds[-1].fragments
        profile = (await mw.read_model.get(user)).profile
        assert profile.name and "Ada" in profile.name

        ids = [user_workflow_id(user), *(r.workflow_id for r in after.rounds)]
        assert await assert_replays(env.client, ids, name="timeskip-gates") == 2


class OutageModels(HeuristicMemoryModels):
    """The offline models behind an LLM outage of `outage_s` seconds of workflow time."""

    def __init__(self, outage_s: float) -> None:
        super().__init__()
        self.outage_s = outage_s
        self.failed_attempts = 0

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        info = activity.info()
        elapsed = (info.current_attempt_scheduled_time - info.scheduled_time).total_seconds()
        if elapsed < self.outage_s:
            self.failed_attempts += 1
            raise ConnectionError(f"LLM unreachable (attempt {info.attempt})")
        return await super().slice(turns, max_fragments)


async def test_llm_down_for_two_hours_then_every_event_indexed_once(
    time_skipping_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    env = time_skipping_env
    models = OutageModels(outage_s=2 * 3600)
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = new_user()
        t0 = (await env.get_current_time()).timestamp()
        handle = await submit(
            env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
        )
        done = await wait_status(
            handle,
            lambda s: s.rounds_completed == 1,
            env=env,
            step_s=600,
            deadline_s=240,
            what="round after the outage",
        )
        assert models.failed_attempts >= 10, "the outage did not last"
        assert done.rounds_failed == 0
        raw = await HeuristicMemoryModels().slice(conversation("t", LINES, t0), max_fragments=16)
        expected = validate_drafts(raw.drafts, len(LINES))
        fragments = await mw.store.all_for_user(user)
        assert len(fragments) == len(expected) == done.rounds[-1].fragments
        assert len({f.id for f in fragments}) == len(fragments)
        assert done.watermarks["t"].indexed == len(LINES)
        await assert_replays(env.client, [user_workflow_id(user)], name="timeskip-outage")


async def test_duplicate_events_and_signals_change_nothing(
    time_skipping_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    env = time_skipping_env
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = new_user()
        t0 = (await env.get_current_time()).timestamp()
        turns = conversation("t", LINES, t0)
        handle = await submit(env.client, mw.task_queue, user, turns, event_id="e1")
        await submit(env.client, mw.task_queue, user, turns, event_id="e1")
        await submit(env.client, mw.task_queue, user, turns[2:], event_id="e2-resend")
        first = await status(handle)
        assert first.watermarks["t"].accepted == len(LINES)
        assert first.pending_turns + first.pending_events <= len(LINES) + 3
        done = await wait_status(
            handle,
            lambda s: s.rounds_completed >= 1 and s.pending_turns == 0,
            env=env,
            step_s=120,
            what="round",
        )
        assert done.rounds_started == 1
        count = await mw.store.count(user)
        assert count == done.rounds[-1].fragments

        ids = [f.id for f in await mw.store.all_for_user(user)]
        for _ in range(2):
            await handle.signal("reinforce", {"call_id": "call-1", "fragment_ids": ids[:1]})
        await handle.signal("reinforce", {"call_id": "call-2", "fragment_ids": ids[:1]})
        await wait_status(handle, lambda s: s.pending_events == 0, env=env, step_s=1)
        [first_fragment] = await mw.store.get(user, ids[:1])
        assert first_fragment.strengthen_count == 2  # call-1 once, call-2 once
        assert await mw.store.count(user) == count
