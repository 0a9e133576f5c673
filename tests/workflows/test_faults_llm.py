"""LLM faults on the time-skipping server with the real worker, Milvus Lite and Redis.

- 429 with Retry-After: the next attempt waits what the provider asked (not the retry policy's
  2 s) and exactly one request is made per attempt (the round's local attempt, then the slice
  activity's first).
- The LLM down for 3 hours of workflow time while the conversation goes on: every turn accepted,
  nothing failed, everything indexed once after it comes back.
- A round that fails permanently: visible as failed, its messages stay un-indexed, and the next
  round (after the back-off) picks them up.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.activities.llm.langchain_models import LangChainMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.round_store import SLICE_AND_TUNE
from mnemoflow.worker.interceptors import MetricsInterceptor
from mnemoflow.worker.metrics import MnemoflowMetrics
from tests.support.deepseek_emulator import DeepSeekEmulator, Reply
from tests.support.drive import conversation, status, submit, wait_status
from tests.support.invariants import Monotonic, indexed_once
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

CFG = MemoryConfig.from_vocation("customer service")
LINES = [
    "I'm Gus and my order 4411 is late.",
    "Checking order 4411.",
    "Please text me, don't call.",
    "Texts only, noted.",
]
SLICE = {
    "fragments": [
        {"theme": "orders", "types": ["identity", "fact"], "content": "Gus, order 4411 late",
         "start_idx": 0, "end_idx": 1},
        {"theme": "contact", "types": ["preference"], "content": "Gus wants texts, not calls",
         "start_idx": 2, "end_idx": 3},
    ]
}  # fmt: skip
TUNE = {"alpha": 0.5, "beta": 0.2, "gamma": 0.3, "delta": 0.0, "w0": 0.1, "w1": 0.8, "w2": 0.1}


class RecordingModels(LangChainMemoryModels):
    """The real DeepSeek path, recording each slice attempt."""

    attempts: list[tuple[int, datetime]]

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        info = activity.info()
        self.attempts.append((info.attempt, info.current_attempt_scheduled_time))
        return await super().slice(turns, max_fragments)


def new_user(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


async def test_429_retry_after_is_honoured_not_hammered(
    time_skipping_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    emulator: DeepSeekEmulator,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    env = time_skipping_env
    emulator.push(Reply.error(429, retry_after="7"), Reply.tool(SLICE))
    for _ in range(2):
        emulator.push(Reply.tool(TUNE))
    chat = emulator.chat_model()
    models = RecordingModels(chat)
    models.attempts = []
    # The worker records metrics as `mnemoflow worker` does: through the client's interceptor.
    metrics = MnemoflowMetrics()
    measured = Client(**{**env.client.config(), "interceptors": [MetricsInterceptor(metrics)]})
    async with memory_worker(
        measured, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = new_user("ratelimited")
        t0 = (await env.get_current_time()).timestamp()
        handle = await submit(
            env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
        )
        done = await wait_status(handle, lambda s: s.rounds_completed == 1, env=env, step_s=1)
        # The round's local attempt got the 429, then the slice activity's first attempt.
        assert [a for a, _ in models.attempts] == [1, 1]
        # Workflow time of the retry: the local attempt's end (the round's timer for the
        # Retry-After starts then) to the slice activity's started event.
        history = await env.client.get_workflow_handle(done.rounds[-1].workflow_id).fetch_history()
        timer = next(
            e for e in history.events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED
        )
        slice_started = next(
            e for e in history.events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
        )  # fmt: skip
        assert slice_started.activity_task_started_event_attributes.attempt == 1
        waited = (
            slice_started.event_time.ToDatetime() - timer.event_time.ToDatetime()
        ).total_seconds()
        assert 7.0 <= waited < 9.0, f"second attempt {waited:.1f}s after the first"
        slice_requests = [r for r in emulator.requests if "fragments" in str(r.body.get("tools"))]
        assert len(slice_requests) == 2  # one per attempt: no client-side retries
        outcome = await indexed_once(mw.store, user, done, {"t": len(LINES)})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    # The 429 is counted as such (the LLM-429 alert reads this counter), the retry succeeded.
    failures = {
        (s.labels["activity"], s.labels["type"]): s.value
        for family in metrics.registry.collect()
        if family.name == "mnemoflow_activity_failures"
        for s in family.samples
        if s.name.endswith("_total")
    }
    # (on the round's local attempt, which makes slice and tune in one step)
    assert failures == {(SLICE_AND_TUNE, "RateLimited"): 1.0}, failures
    reliability.record(
        request,
        key="llm-429",
        kind="fault",
        what="LLM answered 429 with Retry-After: 7 (DeepSeek client, emulated endpoint)",
        happened=f"after the round's local attempt got the 429, the slice activity started "
        f"{waited:.0f} s later in workflow time (the policy alone would wait 2 s); 2 slice "
        "requests for 2 attempts; round completed",
        outcome=outcome,
        started=started,
    )


class OutageModels(HeuristicMemoryModels):
    """The offline models, unreachable until `up_at` in workflow time (the test server's clock,
    read from the activity: attempt timestamps in activity.info() are not skipped-time exact)."""

    def __init__(self, env: WorkflowEnvironment, up_at: float) -> None:
        super().__init__()
        self.env = env
        self.up_at = up_at
        self.failed = 0

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        if (await self.env.get_current_time()).timestamp() < self.up_at:
            self.failed += 1
            raise ConnectionError("LLM unreachable")
        return await super().slice(turns, max_fragments)


async def test_llm_down_three_hours_while_the_conversation_goes_on(
    time_skipping_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    env = time_skipping_env
    t0 = (await env.get_current_time()).timestamp()
    models = OutageModels(env, up_at=t0 + 3 * 3600)
    lines = [
        *LINES,
        "My new phone is a Pixel 9.",
        "Pixel 9, noted.",
        "Ship to 12 Mill Lane.",
        "Ok.",
    ]
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        user = new_user("outage")
        watch = Monotonic()
        turns = conversation("t", lines, t0, step=0.0)
        handle = await submit(env.client, mw.task_queue, user, turns[:4], urgent=True)
        await env.sleep(3600)
        # An hour into the outage nothing is indexed, and the agent goes on talking.
        now = (await env.get_current_time()).timestamp()
        during = await status(handle)
        assert watch.see(during) and during.watermarks["t"].indexed == 0
        assert models.failed > 0 and now < models.up_at
        later = [t.model_copy(update={"time": now}) for t in turns[4:]]
        await submit(env.client, mw.task_queue, user, later, urgent=True)
        done = await wait_status(
            handle,
            lambda s: watch.see(s) and s.watermarks["t"].indexed == len(lines),
            env=env,
            step_s=600,
            deadline_s=120,
            what="everything indexed after the outage",
        )
        assert models.failed >= 10 and done.rounds_failed == 0
        outcome = await indexed_once(mw.store, user, done, {"t": len(lines)})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    reliability.record(
        request,
        key="llm-down-3h",
        kind="fault",
        what="LLM unreachable for 3 hours of workflow time; more turns arrive an hour in",
        happened=f"slice retried {models.failed} times with back-off; later turns were accepted "
        f"meanwhile; no round failed; {outcome.rounds} rounds completed after recovery",
        outcome=outcome,
        started=started,
    )


class Unauthorized(Exception):
    status_code = 401  # a rejected key: not about these turns (a refusal of them is kept verbatim)


class FailOnceModels(HeuristicMemoryModels):
    """The offline models whose slicer is rejected permanently on its first call."""

    def __init__(self) -> None:
        super().__init__()
        self.slice_calls = 0

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        self.slice_calls += 1
        if self.slice_calls == 1:
            raise Unauthorized("invalid api key (test)")
        return await super().slice(turns, max_fragments)


async def test_permanently_failed_round_is_visible_and_the_next_round_picks_it_up(
    time_skipping_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    env = time_skipping_env
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=FailOnceModels()
    ) as mw:
        user = new_user("failed")
        watch = Monotonic()
        t0 = (await env.get_current_time()).timestamp()
        handle = await submit(
            env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
        )
        failed = await wait_status(
            handle, lambda s: watch.see(s) and s.rounds_failed == 1, env=env, step_s=1
        )
        assert failed.rounds[-1].status == "failed"
        assert "Unauthorized" in (failed.rounds[-1].error or "")
        assert failed.pending_turns == len(LINES) and failed.watermarks["t"].indexed == 0
        assert await mw.store.count(user) == 0
        desc = await env.client.get_workflow_handle(failed.rounds[-1].workflow_id).describe()
        assert desc.status is not None and desc.status.name == "FAILED"
        done = await wait_status(
            handle,
            lambda s: watch.see(s) and s.rounds_completed == 1,
            env=env,
            step_s=120,
            what="the next round",
        )
        assert done.rounds[-1].trigger == "ceiling"  # the urgent hand-over, re-run
        assert done.rounds[-1].start == 0 and done.rounds[-1].end == len(LINES)
        outcome = await indexed_once(mw.store, user, done, {"t": len(LINES)})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    reliability.record(
        request,
        key="round-failed",
        kind="fault",
        what="A round that fails permanently (the slicer's request rejected: HTTP 401)",
        happened="round child FAILED and listed as failed in status; its messages stayed "
        f"pending and un-indexed; the next round ({CFG.failed_round_backoff_s:.0f} s back-off) "
        "indexed them (operator retry_round: test_operations.py)",
        outcome=outcome,
        started=started,
    )
