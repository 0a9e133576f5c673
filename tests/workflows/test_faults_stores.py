"""Store outages on the dev server with the real worker: Milvus Lite and redis-server of their own
(not the session's), so the tests can stop and restart them.

- Milvus down: the round's index activity fails and is retried (STORE_RETRY); once Milvus is back
  the round completes, earlier fragments are still there, and turns keep reading their context
  from Redis meanwhile.
- Redis down, then back empty: reads fall back to the workflow query; the round's publish is
  retried until Redis answers, which rebuilds the read model.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import LOOPBACK, free_port, start_milvus_lite, start_redis
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.contracts import ActivityName
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.round_store import STORE_ROUND
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, eventually
from tests.support.invariants import Monotonic, indexed_once
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

HOUR = 3600.0
#: What fails while Milvus is down: the round's index, or an induction already under way (it
#: reads fragments; the user workflow runs one thing at a time, so the round waits behind it).
#: A lean round's store step (index, select, publish) goes on as the activity STORE_ROUND once its
#: local attempts gave up (workflows/memory_round.py, `store_round`).
MILVUS_ACTIVITIES = {ActivityName.INDEX, ActivityName.INDUCT, ActivityName.SELECT, STORE_ROUND}
LINES = [
    "Hello, I'm Bob, a carpenter from Bristol.",
    "Hi Bob, how can I help?",
    "Please change the address of order 90017 to 12 Mill Lane.",
    "Address of order 90017 updated.",
    "I go fishing on Sundays, so deliver on weekdays.",
    "Weekday delivery noted.",
    "My favourite food is mushroom risotto.",
    "Sounds delicious.",
]


async def retrying(client: Client, user: str, activities: set[str]) -> int:
    """The attempt number of one of `activities` once it failed (else 0), pending on the user's
    workflow (an induction reads Milvus too) or on its running round."""
    handle = client.get_workflow_handle(user_workflow_id(user))
    status = await handle.query(UserMemoryWorkflow.status)
    ids = [handle.id, *(r.workflow_id for r in status.rounds if r.status == "running")]
    for workflow_id in ids:
        desc = await client.get_workflow_handle(workflow_id).describe()
        for pending in desc.raw_description.pending_activities:
            if pending.activity_type.name in activities and pending.attempt >= 2:
                return int(pending.attempt)
    return 0


async def wait_indexed(memory: MemoryClient, user: str, end: int, watch: Monotonic) -> None:
    async def check() -> bool:
        s = await memory.status(user)
        return bool(
            s
            and watch.see(s)
            and s.watermarks.get("t")
            and s.watermarks["t"].indexed >= end
            and s.uninducted == 0  # induction's publish done: the read model is settled
        )

    await eventually(check, deadline_s=60, what=f"indexed up to {end}")


async def test_milvus_down_then_back(
    dev_env: WorkflowEnvironment,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    port = free_port()
    milvus = await asyncio.to_thread(start_milvus_lite, port, tmp_path / "milvus")
    uri = f"http://{LOOPBACK}:{port}"
    try:
        async with (
            AsyncExitStack() as stack,
            memory_worker(
                dev_env.client, milvus_uri=uri, redis_url=redis_url, models=HeuristicMemoryModels()
            ) as mw,
        ):
            memory = mw.memory_client(redis_url)
            stack.push_async_callback(memory.aclose)
            user = f"milvus-{uuid.uuid4().hex[:8]}"
            mw.track(user_workflow_id(user))
            watch = Monotonic()
            turns = conversation("t", LINES, time.time() - 3 * HOUR)
            await memory.submit(user, turns[:4], urgent=True)
            await wait_indexed(memory, user, 4, watch)
            before = await memory.context(user)
            assert before is not None and before.fragments

            await asyncio.to_thread(milvus.stop)
            await memory.submit(user, turns[4:], urgent=True)
            attempt = 0

            async def index_failing() -> bool:
                nonlocal attempt
                attempt = await retrying(dev_env.client, user, MILVUS_ACTIVITIES)
                return attempt >= 2

            await eventually(index_failing, deadline_s=30, what="a Milvus activity retried")
            during = await memory.context(user)  # a turn during the outage still gets memory
            assert during is not None and during.version == before.version

            milvus = await asyncio.to_thread(start_milvus_lite, port, tmp_path / "milvus")
            await wait_indexed(memory, user, len(LINES), watch)
            status = await memory.status(user)
            assert status is not None and status.rounds_failed == 0
            outcome = await indexed_once(mw.store, user, status, {"t": len(LINES)})
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    finally:
        await asyncio.to_thread(milvus.stop)
    reliability.record(
        request,
        key="milvus-down",
        kind="fault",
        what="Milvus Lite server stopped during a conversation, restarted on its data dir",
        happened=f"index/induct activities failed and were retried (attempt {attempt} seen), "
        "turns read their context from Redis meanwhile; after the restart the round completed "
        f"and the earlier fragments were intact ({outcome.fragments} in all)",
        outcome=outcome,
        started=started,
    )


async def test_redis_down_then_back_empty_rebuilds_the_read_model(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    port = free_port()
    redis = await asyncio.to_thread(start_redis, port, tmp_path / "redis-1")
    url = f"redis://{LOOPBACK}:{port}/0"
    try:
        async with (
            AsyncExitStack() as stack,
            memory_worker(
                dev_env.client, milvus_uri=milvus_uri, redis_url=url, models=HeuristicMemoryModels()
            ) as mw,
        ):
            memory = mw.memory_client(url)
            stack.push_async_callback(memory.aclose)
            user = f"redis-{uuid.uuid4().hex[:8]}"
            mw.track(user_workflow_id(user))
            watch = Monotonic()
            turns = conversation("t", LINES, time.time() - 3 * HOUR)
            await memory.submit(user, turns[:4], urgent=True)
            await wait_indexed(memory, user, 4, watch)
            assert await mw.read_model.get(user) is not None

            await asyncio.to_thread(redis.stop)
            fallback = await memory.context(user)  # Redis down: the workflow query answers
            assert fallback is not None and fallback.fragments
            await memory.submit(user, turns[4:], urgent=True)
            attempt = 0

            async def publish_failing() -> bool:
                nonlocal attempt
                attempt = await retrying(dev_env.client, user, {ActivityName.PUBLISH, STORE_ROUND})
                return attempt >= 2

            await eventually(publish_failing, deadline_s=30, what="publish retried")
            # Back on a fresh data dir: the cache is gone, as after losing a Redis node.
            redis = await asyncio.to_thread(start_redis, port, tmp_path / "redis-2")
            await wait_indexed(memory, user, len(LINES), watch)
            rebuilt = await mw.read_model.get(user)
            query = await dev_env.client.get_workflow_handle(user_workflow_id(user)).query(
                UserMemoryWorkflow.context
            )
            assert rebuilt is not None and rebuilt.version == query.version
            assert rebuilt.watermarks["t"].indexed == len(LINES)
            status = await memory.status(user)
            assert status is not None and status.rounds_failed == 0
            outcome = await indexed_once(mw.store, user, status, {"t": len(LINES)})
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    finally:
        await asyncio.to_thread(redis.stop)
    reliability.record(
        request,
        key="redis-down",
        kind="fault",
        what="redis-server stopped during a conversation, restarted empty (read model lost)",
        happened="turns read their context through the workflow query; the round's publish "
        f"was retried (attempt {attempt} seen) and rebuilt the read model at version "
        f"{rebuilt.version} once Redis was back",
        outcome=outcome,
        started=started,
    )
