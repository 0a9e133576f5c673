"""The user workflow's updates on the dev server: remember, recall, forget a fragment, forget."""

from __future__ import annotations

import time
import uuid

from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.contracts import (
    ForgetFragmentRequest,
    ForgetRequest,
    RecallRequest,
    RememberRequest,
)
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, status, submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.replay import assert_replays

LINES = [
    "Hello, I'm Carla and my order 31337 is missing a lid.",
    "Sorry to hear that, Carla.",
    "Please send the lid to 9 Rue Cler, Paris.",
    "Will do.",
]


async def test_remember_recall_and_forget_one_fragment(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user, other = f"carla-{uuid.uuid4().hex[:6]}", f"dan-{uuid.uuid4().hex[:6]}"
        t0 = time.time() - 7200
        handle = await submit(dev_env.client, mw.task_queue, user, conversation("t", LINES, t0))
        other_handle = await submit(
            dev_env.client, mw.task_queue, other, conversation("t", ["I'm Dan."], t0)
        )
        req = RememberRequest(event_id="m-1", content="Carla is allergic to peanuts.")
        first = await handle.execute_update(UserMemoryWorkflow.remember, req)
        again = await handle.execute_update(UserMemoryWorkflow.remember, req)
        assert first.fragment_id == again.fragment_id  # same event, same row

        found = await handle.execute_update(
            UserMemoryWorkflow.recall, RecallRequest(query="peanut allergy", top_k=3)
        )
        assert found.fragments[0].id == first.fragment_id
        assert "peanuts" in found.fragments[0].content

        # Dan's workflow cannot delete Carla's fragment, whatever id it is given.
        miss = await other_handle.execute_update(
            UserMemoryWorkflow.forget_fragment,
            ForgetFragmentRequest(fragment_id=first.fragment_id),
        )
        assert miss.deleted == 0
        assert await mw.store.get(user, [first.fragment_id])
        hit = await handle.execute_update(
            UserMemoryWorkflow.forget_fragment,
            ForgetFragmentRequest(fragment_id=first.fragment_id),
        )
        assert hit.deleted == 1 and not await mw.store.get(user, [first.fragment_id])
        await wait_status(handle, lambda s: s.pending_turns == 0, deadline_s=60)
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="requests-remember")


async def test_forget_deletes_everything_and_resends_bring_nothing_back(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"erin-{uuid.uuid4().hex[:6]}"
        turns = conversation("t", LINES, time.time() - 7200)
        handle = await submit(dev_env.client, mw.task_queue, user, turns)
        done = await wait_status(
            handle, lambda s: s.inductions >= 1 and s.pending_turns == 0, deadline_s=60
        )
        stored = await mw.store.count(user)
        assert stored > 0 and await mw.read_model.get(user) is not None

        receipt = await handle.execute_update(
            UserMemoryWorkflow.forget, ForgetRequest(reason="test")
        )
        assert receipt.fragments_deleted == stored
        assert receipt.read_model_deleted == 1 and receipt.profile_cleared
        assert await mw.store.count(user) == 0
        assert await mw.read_model.get(user) is None
        assert (await handle.query(UserMemoryWorkflow.profile)).is_empty()

        # The same turns sent again (new event id) are recognised by position: nothing returns.
        await submit(dev_env.client, mw.task_queue, user, turns, event_id="resend-after-forget")
        after = await wait_status(handle, lambda s: s.pending_events == 0, deadline_s=30)
        assert after.pending_turns == 0 and after.rounds_started == done.rounds_started
        assert await mw.store.count(user) == 0
        assert (await status(handle)).uninducted == 0
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="requests-forget")


async def test_a_fresh_run_after_termination_skips_used_round_ids(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"fay-{uuid.uuid4().hex[:6]}"
        t0 = time.time() - 7200
        handle = await submit(dev_env.client, mw.task_queue, user, conversation("a", LINES, t0))
        await wait_status(handle, lambda s: s.rounds_completed == 1, deadline_s=60)
        await handle.terminate("operator mistake")  # the run's state (round counter) is gone

        handle = await submit(dev_env.client, mw.task_queue, user, conversation("b", LINES, t0))
        done = await wait_status(handle, lambda s: s.rounds_completed == 1, deadline_s=60)
        assert done.rounds[-1].round_no > 1  # round-1 is taken (REJECT_DUPLICATE): skipped
        assert done.rounds_failed == 0
        assert await mw.store.count(user) >= done.rounds[-1].fragments
