"""Forget epochs in the user workflow (docs/ARCHITECTURE.md, "Forget epochs"), on the dev server
with the production worker wiring, Milvus Lite and redis-server."""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aioredis
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.contracts import ConsolidateRequest, SubmitEvent
from mnemoflow.models.ids import epoch_key
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker


async def test_a_history_behind_the_stored_epoch_takes_it_and_stores_its_lines(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The user's epoch record is ahead of the workflow's (an earlier history of the user was
    forgotten, and this fresh one could not read the record at its start): the store refuses
    the first round's write as stale; the workflow takes the record's epoch and the next round
    stores every line at once, not after the failed-round back-off (10 minutes)."""
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"behind-{uuid.uuid4().hex[:8]}"
        lines = [f"Line {i} of {user}: my parcel number is {5100 + 37 * i}." for i in range(4)]
        said = conversation("t", lines, time.time())  # not mature: no round before consolidate
        handle = await submit(dev_env.client, mw.task_queue, user, said[:2])
        await wait_status(handle, lambda s: s.pending_turns == 2, what="first accepted")
        # Absorbed by the loop, so only once the start has read what is stored (epoch 0).
        await handle.signal(UserMemoryWorkflow.submit, SubmitEvent(event_id="b", turns=said[2:]))
        await wait_status(handle, lambda s: s.pending_turns == len(lines), what="accepted")
        redis = aioredis.Redis.from_url(redis_url)
        try:
            await redis.set(epoch_key(mw.read_model.prefix, user), 3)
        finally:
            await redis.aclose()
        await handle.execute_update(
            UserMemoryWorkflow.consolidate, ConsolidateRequest(thread_id="t")
        )
        status = await wait_status(
            handle,
            lambda s: s.pending_turns == 0 and s.rounds_completed >= 1,
            deadline_s=60,
            what="stored under the record's epoch",
        )
        stored = " ".join(f.content for f in await mw.store.all_for_user(user))
        assert [x for x in lines if x not in stored] == []
        assert status.forget_epoch == 3 and status.rounds_failed == 1
        assert "StaleEpoch" in (status.rounds[0].error or "")
