"""Forget while a round is writing to Milvus, on the dev server with a worker process whose
index write blocks in a thread (as a slow pymilvus call does: cancelling the activity cannot
stop it, and the write goes on after the forget's receipt).

The forget cancels the round and deletes; every write still under way carries the forget epoch
the round started under, which the store refuses once the forget moved the user's record past
it (docs/ARCHITECTURE.md, "Forget epochs"). The rows are counted after every held write has
ended, not at the receipt: no fragment comes back, and the receipt counts the cancelled round.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.round_store import STORE_ROUND
from tests.support.drive import STARTED, conversation, eventually, submit, wait_status
from tests.support.invariants import said_vs_stored
from tests.support.memory_worker import terminate_started
from tests.support.reliability import Ledger
from tests.support.worker_process import worker_process
from tests.workflows.test_faults_processes import activity_running

pytestmark = pytest.mark.integration

LINES = [
    "My passport number is X7731942, I need it for the booking.",
    "Thanks, I have the passport number.",
    "And my frequent flyer id is FF-220-981.",
    "Frequent flyer id saved.",
]


async def test_forget_during_a_round_write_leaves_nothing_behind(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    client = dev_env.client
    tag = uuid.uuid4().hex[:10]
    task_queue, collection, prefix = f"tq-fence-{tag}", f"t_fence_{tag}", f"test:{tag}:"
    address = client.service_client.config.target_host
    store = FragmentStore(uri=milvus_uri, embeddings=HashingEmbeddings(), collection=collection)
    user = f"fence-{tag}"
    writes = tmp_path / "writes.log"
    try:
        with worker_process(
            tmp_path, "slow", address=address, task_queue=task_queue, milvus=milvus_uri,
            redis=redis_url, collection=collection, prefix=prefix, slow_index_s=14,
            blocking_index=True, local_store_bound_s=2.0, write_log=writes,
        ):  # fmt: skip
            handle = await submit(
                client, task_queue, user, conversation("t", LINES, time.time() - 3 * 3600),
                urgent=True,
            )  # fmt: skip
            running = await wait_status(handle, lambda s: bool(s.rounds), what="round started")
            round_id = running.rounds[-1].workflow_id
            # The store step's local attempts give up after 2 s here (10 s in production); the
            # activity then writes, after every write of a timed-out local attempt started.
            await eventually(
                lambda: activity_running(client, round_id, STORE_ROUND),
                deadline_s=60,
                what="the round's store write under way",
            )
            memory = MemoryClient(temporal=client, task_queue=task_queue, redis=redis_url,
                                  key_prefix=prefix)  # fmt: skip
            receipt = await memory.forget(user, "during the write")
            count_at_receipt = await store.count(user)
            round_handle = client.get_workflow_handle(round_id)
            desc = await round_handle.describe()
            assert desc.status != WorkflowExecutionStatus.RUNNING, "the round ended first"
            # The writes the worker still holds in their threads end up to 14 s after the
            # receipt: wait (with a deadline) until every one that began has ended, then count.
            log = await writes_over(writes, deadline_s=60)
            began = sum(line == "began" for line in log)
            refused = sum(line.startswith("ended refused") for line in log)
            count_after = await store.count(user)
            assert count_after == 0, f"{count_after} rows landed after the forget: {log}"
            assert began >= 1 and refused >= 1, log
            assert receipt.rounds_cancelled == 1 and count_at_receipt == 0
            outcome = await said_vs_stored(store, user, None, {}, forgotten=LINES)
            assert outcome.clean, outcome
            context = await memory.context(user)
            assert context is None or not context.fragments
            await memory.aclose()
            await terminate_started(client, task_queue)
    finally:
        STARTED.pop(task_queue, None)
        await store.drop()
        await store.close()
    reliability.record(
        request,
        key="forget-during-write",
        kind="fault",
        what="Forget requested while the round's store writes were under way in a worker process "
        "(writes in threads that cancelling cannot stop, ending up to 14 s after the receipt)",
        happened=f"the forget cancelled the round and moved the user's forget epoch to "
        f"{receipt.epoch}; {refused} of {began} held writes refused by the store when they "
        f"went on; receipt: {receipt.rounds_cancelled} round cancelled; counted after every "
        f"held write ended: {count_after} rows back",
        outcome=outcome,
        started=started,
    )


async def writes_over(path: Path, deadline_s: float) -> list[str]:
    """The worker's write log once every held write that began has ended (deadline_s at most)."""
    deadline = time.monotonic() + deadline_s
    while True:
        log = await asyncio.to_thread(_lines, path)
        began = sum(line == "began" for line in log)
        if began and began == sum(line.startswith("ended") for line in log):
            return log
        assert time.monotonic() < deadline, f"held writes still under way: {log}"
        await asyncio.sleep(0.2)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
