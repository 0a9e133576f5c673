"""Forgetting while other work of the same user is in flight, on the dev server with the
production worker wiring: nothing forgotten comes back, nothing said after the forget waits.

- A reinforce reads a fragment's row and writes it back whole: a `forget_fragment` whose delete
  landed in between was undone (the fragment came back, strengthened). The delete now waits for
  a reinforce in flight, and a reinforce leaves out what is being forgotten.
- A forget that cancels a running round recorded it as failed, with the failed-round back-off
  (600 s): the first turns said after the forget waited that long, consolidate or not.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowUpdateStage
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.contracts import (
    ActivityName,
    ConsolidateRequest,
    ForgetFragmentRequest,
    ForgetRequest,
    ReinforceEvent,
)
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker

pytestmark = pytest.mark.integration

HOUR = 3600.0


def lines(tag: str, n: int, who: str) -> list[str]:
    """Distinct lines: every turn says something no other turn says."""
    return [f"{who} {tag} line {i}: my locker number is {4100 + i * 13}." for i in range(n)]


async def _activity_scheduled(handle: Any, name: str) -> bool:
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            if event.activity_task_scheduled_event_attributes.activity_type.name == name:
                return True
    return False


async def test_a_fragment_forgotten_while_it_is_reinforced_stays_forgotten(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        tag = uuid.uuid4().hex[:8]
        user = f"race-reinforce-{tag}"
        said = lines(tag, 6, "u")
        handle = await submit(
            dev_env.client, mw.task_queue, user, conversation("t", said, time.time() - 3 * HOUR)
        )
        await wait_status(handle, lambda s: s.pending_turns == 0 and s.rounds_completed >= 1)
        [victim, *_] = await mw.store.all_for_user(user)

        # Hold the reinforce activity inside the store until the forget has been accepted.
        entered, release = asyncio.Event(), asyncio.Event()
        reinforce: Callable[..., Awaitable[int]] = mw.store.reinforce

        async def held(*args: Any, **kwargs: Any) -> int:
            entered.set()
            await release.wait()
            return await reinforce(*args, **kwargs)

        mw.store.reinforce = held  # type: ignore[method-assign]
        try:
            await handle.signal(
                UserMemoryWorkflow.reinforce, ReinforceEvent(call_id="c1", fragment_ids=[victim.id])
            )
            await asyncio.wait_for(entered.wait(), timeout=60)
            forget = await handle.start_update(
                UserMemoryWorkflow.forget_fragment,
                ForgetFragmentRequest(fragment_id=victim.id),
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )
            # Accepted means the task that took the update has completed: had the handler
            # scheduled the delete at once, it would be in the history by now.
            assert not await _activity_scheduled(handle, ActivityName.DELETE_FRAGMENTS), (
                "the delete was scheduled while a reinforce of the same fragment was in flight"
            )
            release.set()
            result = await forget.result()
        finally:
            release.set()
            mw.store.reinforce = reinforce  # type: ignore[method-assign]
        assert result.deleted == 1
        # A model call that used the fragment earlier reports it again: nothing comes back.
        await handle.signal(
            UserMemoryWorkflow.reinforce, ReinforceEvent(call_id="c2", fragment_ids=[victim.id])
        )
        await wait_status(handle, lambda s: s.pending_events == 0)
        assert await mw.store.get(user, [victim.id]) == []
        assert victim.id not in {f.id for f in await mw.store.all_for_user(user)}
        # ... and no line of it is left for the per-call search served by Milvus.
        assert victim.id not in await mw.store.lined_ids(user)


async def test_turns_said_after_a_forget_that_cancelled_a_round_are_indexed_at_once(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    # Each LLM call takes 2 s, so the round the consolidation starts is still running when
    # the forget arrives.
    models = HeuristicMemoryModels(latency_s=2.0)
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=models
    ) as mw:
        tag = uuid.uuid4().hex[:8]
        user = f"race-backoff-{tag}"
        before = lines(tag, 8, "before")
        handle = await submit(
            dev_env.client, mw.task_queue, user, conversation("t", before, time.time() - 60)
        )
        await handle.execute_update(
            UserMemoryWorkflow.consolidate, ConsolidateRequest(thread_id="t")
        )
        await wait_status(handle, lambda s: any(r.status == "running" for r in s.rounds))
        receipt = await handle.execute_update(UserMemoryWorkflow.forget, ForgetRequest())
        assert receipt.rounds_cancelled == 1

        after = lines(tag, 4, "after")
        await submit(dev_env.client, mw.task_queue, user, conversation("t", after, time.time() + 1))
        await handle.execute_update(
            UserMemoryWorkflow.consolidate, ConsolidateRequest(thread_id="t")
        )
        # Within a minute, not after the 600 s back-off of a failed round.
        done = await wait_status(
            handle, lambda s: s.pending_turns == 0 and s.rounds_completed >= 1, deadline_s=60
        )
        stored = " ".join(f.content for f in await mw.store.all_for_user(user))
        assert all(line in stored for line in after), done
        assert not any(line in stored for line in before)
        assert user_workflow_id(user) == handle.id
