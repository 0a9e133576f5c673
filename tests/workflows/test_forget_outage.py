"""Forget during a Milvus outage longer than the store deadline (hours of workflow time on the
time-skipping server, with the real worker, a Milvus Lite server of its own and Redis).

The user workflow must never go FAILED: the forget waits, `status` shows it pending, and once
Milvus is back the receipt arrives and the user's workflow (and its state) carries on.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.client import (
    WorkflowExecutionStatus,
    WorkflowUpdateStage,
)
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import LOOPBACK, free_port, start_milvus_lite
from mnemoflow.models.contracts import ForgetRequest
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, submit, wait_status
from tests.support.invariants import said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger
from tests.support.temporal import started_time_skipping

pytestmark = pytest.mark.integration

LINES = [
    "My name is Ines Carvalho and my flat is above the bakery on Rua Augusta.",
    "Hello Ines, noted.",
    "My insurance number is PT-5521-0931, please keep it on file.",
    "Kept on file.",
]


@pytest_asyncio.fixture
async def own_time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of this test's own: on the shared one, a workflow another test
    left running holds virtual time back, and this test waits out hours of it."""
    async with started_time_skipping() as env:
        yield env


async def test_forget_through_a_milvus_outage_of_hours_never_fails_the_workflow(
    own_time_skipping_env: WorkflowEnvironment,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    env = own_time_skipping_env
    port = free_port()
    milvus = await asyncio.to_thread(start_milvus_lite, port, tmp_path / "milvus")
    uri = f"http://{LOOPBACK}:{port}"
    try:
        async with memory_worker(
            env.client, milvus_uri=uri, redis_url=redis_url, models=HeuristicMemoryModels()
        ) as mw:
            user = f"forget-outage-{uuid.uuid4().hex[:8]}"
            t0 = (await env.get_current_time()).timestamp()
            handle = await submit(
                env.client, mw.task_queue, user, conversation("t", LINES, t0), urgent=True
            )
            first = await wait_status(
                handle, lambda s: s.rounds_completed == 1, env=env, what="the first round"
            )
            # Counted before the forget: every line stored once; after it: in no row.
            outcome = await said_vs_stored(mw.store, user, first, {"t": LINES})
            assert outcome.clean, outcome
            await asyncio.to_thread(milvus.stop)

            update = await handle.start_update(
                UserMemoryWorkflow.forget,
                ForgetRequest(reason="outage test"),
                wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            )
            # Past the store deadline (1 h): the forget waits, it does not fail.
            pending = await wait_status(
                handle,
                lambda s: s.forget_pending and "forget pending" in (s.last_error or ""),
                env=env,
                step_s=600,
                deadline_s=180,
                what="forget pending after the store deadline",
            )
            desc = await handle.describe()
            assert desc.status == WorkflowExecutionStatus.RUNNING
            assert pending.watermarks["t"].indexed == len(LINES), "state kept while waiting"

            milvus = await asyncio.to_thread(start_milvus_lite, port, tmp_path / "milvus")
            # Virtual time jumps (300 s a step) to the next retry of the forget's store step.
            # Polled through the status query: a long poll of the update's result on the
            # time-skipping server held on for 20 s past its 5 s rpc_timeout before each step.
            after = await wait_status(
                handle,
                lambda s: not s.forget_pending,
                env=env,
                step_s=300,
                deadline_s=180,
                what="forget done after Milvus came back",
            )
            receipt = await update.result(rpc_timeout=timedelta(seconds=30))
            assert receipt.fragments_deleted > 0 and receipt.profile_cleared
            outcome += await said_vs_stored(mw.store, user, None, {}, forgotten=LINES)
            assert outcome.clean and await mw.store.count(user) == 0, outcome
            assert after.rounds_completed == 1, "the same workflow's state, not a fresh run"
            assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    finally:
        await asyncio.to_thread(milvus.stop)
    reliability.record(
        request,
        key="forget-store-outage",
        kind="fault",
        what="Forget requested while Milvus is down for over two hours of workflow time (past "
        "the store deadline of 1 h)",
        happened="the user workflow kept running with its state, status showed the forget "
        "pending; once Milvus was back the forget's store step was retried and the receipt "
        f"returned ({receipt.fragments_deleted} fragments deleted); {len(LINES)} lines counted "
        "stored once before the forget and in no row after it",
        outcome=outcome,
        started=started,
    )
