"""A fresh user workflow for a user whose memory is still stored: the switch to pseudonymous
workflow ids (a new id starts a new, empty user workflow), or a workflow an operator
terminated whose rounds then left Temporal (retention). Fragment ids derive from round numbers,
so a history numbering its rounds from 1 again overwrote the earlier rows one by one, and Redis
refused its contexts (numbered from 0) under the earlier one's. A fresh history now reads what
is stored first (workflows/user_rounds.py number_above_stored)."""

from __future__ import annotations

import time
import uuid

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.contracts import SubmitEvent, UserMemoryInput, UserStatus
from mnemoflow.models.ids import pseudonymous_workflow_id, round_workflow_id, user_workflow_id
from mnemoflow.models.turns import ChatTurn
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import STARTED, eventually, status, wait_status
from tests.support.memory_worker import MemoryWorker, memory_worker
from tests.workflows.test_recent_forgets import CONFIG, HOUR, exchange


async def hand_over(
    mw: MemoryWorker, user: str, workflow_id: str, turns: list[ChatTurn], end: int, **inp: object
) -> WorkflowHandle:
    """Signal-with-start `workflow_id` with the turns; wait until its thread "t" counts `end`
    messages indexed."""
    STARTED.setdefault(mw.task_queue, set()).add(workflow_id)
    event = SubmitEvent(
        event_id=f"t:{turns[0].position}-{turns[-1].position}", turns=turns, urgent=True
    )
    handle = await mw.client.start_workflow(
        UserMemoryWorkflow.run,
        UserMemoryInput(user_id=user, config=CONFIG, **inp),  # type: ignore[arg-type]
        id=workflow_id,
        task_queue=mw.task_queue,
        start_signal="submit",
        start_signal_args=[event],
    )

    def indexed(s: UserStatus) -> bool:
        return "t" in s.watermarks and s.watermarks["t"].indexed >= end

    await wait_status(handle, indexed, deadline_s=90, what=f"indexed {end}")
    return handle


async def _deleted(client: Client, workflow_ids: list[str]) -> None:
    for wid in workflow_ids:
        await client.workflow_service.delete_workflow_execution(
            DeleteWorkflowExecutionRequest(
                namespace=client.namespace, workflow_execution=WorkflowExecution(workflow_id=wid)
            )
        )

    async def gone(wid: str) -> bool:
        try:
            await client.get_workflow_handle(wid).describe()
        except RPCError:
            return True
        return False

    for wid in workflow_ids:
        await eventually(lambda wid=wid: gone(wid), deadline_s=120, what=f"{wid} deleted")  # type: ignore[misc]


@pytest.mark.parametrize("how", ["pseudonymous", "retention"])
async def test_a_fresh_history_keeps_what_the_earlier_one_stored(
    how: str, dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client
    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"fresh-{how[:5]}-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 2 * HOUR
        first = user_workflow_id(user)
        handle = None
        for n in range(6):
            handle = await hand_over(mw, user, first, exchange(n, t0 + n * 60), 2 * n + 2)
        assert handle is not None
        done = await status(handle)
        before = {f.id: f.content for f in await mw.store.all_for_user(user)}
        old_version = (await mw.read_model.get(user) or pytest.fail("nothing published")).version
        assert len(before) >= 6 and old_version >= 6

        if how == "pseudonymous":
            second, inp = pseudonymous_workflow_id(user), {"pseudonymous": True}
        else:  # terminated by an operator; its rounds left Temporal with retention
            await handle.terminate("operator")
            await _deleted(client, [first, *(r.workflow_id for r in done.rounds)])
            second, inp = first, {}
        # The same user on a fresh history: new lines, every one distinct.
        t1 = time.time() - HOUR
        fresh = None
        for k in range(4):
            turns = exchange(100 + k, t1 + k * 60)
            fresh = await hand_over(mw, user, second, turns, 2 * k + 2, **inp)
        assert fresh is not None
        now = await status(fresh)
        assert now.rounds_completed == 4
        assert min(r.round_no for r in now.rounds) > max(r.round_no for r in done.rounds)
        assert all(round_workflow_id(second, r.round_no) == r.workflow_id for r in now.rounds)
        # Nothing stored before was overwritten.
        after = {f.id: f.content for f in await mw.store.all_for_user(user)}
        assert {k: after.get(k) for k in before} == before
        assert len(after) > len(before)
        # Redis holds the fresh history's context, numbered above the earlier one's.
        published = await mw.read_model.get(user)
        own = await fresh.query(UserMemoryWorkflow.context)
        assert published is not None and published.version > old_version
        assert [f.id for f in published.fragments] == [f.id for f in own.fragments]
