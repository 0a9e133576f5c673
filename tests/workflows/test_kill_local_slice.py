"""A worker SIGKILLed during a round's local slice attempt, with the production bounds.

In the default single-queue layout (`mnemoflow worker`, `mnemoflow dev`) a round's LLM step is
first one local attempt inside the round's workflow task (docs/ARCHITECTURE.md, "The round").
A local activity has no heartbeat: when the worker holding that task dies, Temporal hands the
task to another worker only once the task's timeout has passed (`ROUND_TASK_TIMEOUT`). Here two
real worker processes serve one task queue with every production bound (no lowered local
bounds, no lowered task timeout); the first one's memory model takes two minutes a call, so its
local slice attempt is under way when it is killed. The round must settle on the second worker
within seconds, and every line said must be stored exactly once.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.models.contracts import UserStatus
from mnemoflow.workflows.options import ROUND_TASK_TIMEOUT
from tests.support.drive import STARTED, conversation, eventually, status, submit, wait_status
from tests.support.invariants import Monotonic, said_vs_stored
from tests.support.memory_worker import terminate_started
from tests.support.reliability import Ledger
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

HOUR = 3600.0
#: Kill to settled. The round's task is handed to the second worker once ROUND_TASK_TIMEOUT
#: (10 s) has passed since the dead worker last started it; replaying the round, the second
#: worker's local slice (offline model, milliseconds) and the store step take about a second
#: on this machine. 15 s leaves four seconds for a loaded CI machine and is under a third of
#: the 55 s the rounds' task timeout was before.
SETTLE_BOUND_S = 15.0
LINES = [
    "Hi, I'm Ines Okafor; I repair church organs in Ghent.",
    "Welcome Ines, what can I do for you?",
    "The bellows I ordered, part BX-5581, came with a torn seam.",
    "Sorry about BX-5581; I'll open a claim.",
    "Please call only after 4 pm, I'm up in lofts all morning.",
    "Understood: calls after 4 pm only.",
]


def marks(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def closed_at(client: Client, workflow_id: str) -> float | None:
    """When the workflow completed (server clock, epoch seconds), None while it runs."""
    desc = await client.get_workflow_handle(workflow_id).describe()
    if desc.status != WorkflowExecutionStatus.COMPLETED or desc.close_time is None:
        assert desc.status in (None, WorkflowExecutionStatus.RUNNING), desc.status
        return None
    return desc.close_time.timestamp()


async def test_worker_killed_in_the_local_slice_attempt_round_settles_on_the_other(
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
    task_queue, collection, prefix = f"tq-kls-{tag}", f"t_kls_{tag}", f"test:{tag}:"
    # Every bound is the production one: no local_*_bound_s, no round_task_timeout_s.
    common = dict(
        address=client.service_client.config.target_host, task_queue=task_queue,
        milvus=milvus_uri, redis=redis_url, collection=collection, prefix=prefix,
    )  # fmt: skip
    store = FragmentStore(uri=milvus_uri, embeddings=HashingEmbeddings(), collection=collection)
    user = f"kls-{tag}"
    said = [f"{line} [{tag}]" for line in LINES]  # distinct from any other test's lines
    watch = Monotonic()
    first_marks, second_marks = tmp_path / "first.marks", tmp_path / "second.marks"
    try:
        with worker_process(
            tmp_path, "first", slow_llm_s=120.0, llm_marks=first_marks, **common
        ) as first:  # type: ignore[arg-type]
            handle = await submit(
                client, task_queue, user, conversation("t", said, time.time() - 3 * HOUR),
                urgent=True,
            )  # fmt: skip
            running = await wait_status(
                handle, lambda s: watch.see(s) and bool(s.rounds), what="round started"
            )
            round_id = running.rounds[-1].workflow_id

            async def slicing_locally() -> bool:
                return "slice local" in marks(first_marks)

            await eventually(slicing_locally, deadline_s=30, what="the local slice attempt")
            with worker_process(tmp_path, "second", llm_marks=second_marks, **common) as second:  # type: ignore[arg-type]
                # The first worker is inside its local attempt (30 s bound, its model takes
                # 120 s): no activity of the round is scheduled yet.
                assert await closed_at(client, round_id) is None
                assert marks(first_marks) == ["slice local"], "not in the local attempt any more"
                os.kill(first.pid, signal.SIGKILL)
                killed_at = time.time()
                first.wait(timeout=10)
                box: dict[str, float] = {}

                async def round_closed() -> bool:
                    at = await closed_at(client, round_id)
                    if at is not None:
                        box["at"] = at
                    return at is not None

                # Waited for past the bound, so the test reports the figure when it fails.
                await eventually(round_closed, deadline_s=90, what="round completed elsewhere")
                settled_after = box["at"] - killed_at
                history = await client.get_workflow_handle(round_id).fetch_history()
                took = [
                    e.workflow_task_started_event_attributes.identity
                    for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED
                ]
                timed_out = sum(
                    e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
                    for e in history.events
                )
                print(
                    f"round settled {settled_after:.1f} s after the SIGKILL "
                    f"(task timeout {ROUND_TASK_TIMEOUT.total_seconds():.0f} s); task takers "
                    f"{took}; second worker's model calls {marks(second_marks)}"
                )
                assert settled_after < SETTLE_BOUND_S, (
                    f"round settled {settled_after:.1f} s after the kill"
                )
                assert took[0].startswith(f"{first.pid}@"), took
                assert took[-1].startswith(f"{second.pid}@"), "the second worker did not finish it"
                assert timed_out >= 1, "the round's task was not taken over after a timeout"
                # The second worker made the slice call again, locally: nothing was lost with
                # the first one's attempt.
                assert "slice local" in marks(second_marks)
                box_status: dict[str, UserStatus] = {}

                async def all_indexed() -> bool:
                    try:  # queries go to the dead worker's sticky queue for a few seconds
                        box_status["s"] = await status(handle)
                    except RPCError:
                        return False
                    s = box_status["s"]
                    mark = s.watermarks.get("t")
                    return watch.see(s) and mark is not None and mark.indexed == len(said)

                await eventually(all_indexed, deadline_s=30, what="every line indexed")
                # The user workflow learns of it once its own task left the dead worker's
                # sticky queue (the SDK's 10 s): its watermark, not the round, is what the
                # agent's trimming waits for.
                indexed_after = time.time() - killed_at
                done = box_status["s"]
                report = await said_vs_stored(store, user, done, {"t": said})
                assert done.rounds_failed == 0 and done.rounds_completed == 1
                assert (report.lost, report.duplicated) == (0, 0), report
                await terminate_started(client, task_queue)
    finally:
        STARTED.pop(task_queue, None)
        await store.drop()
        await store.close()
    reliability.record(
        request,
        key="worker-sigkill-local-slice",
        kind="fault",
        what="Worker process killed with SIGKILL during a round's local slice attempt (single "
        "queue, production bounds: 30 s local LLM attempt, round task timeout "
        f"{ROUND_TASK_TIMEOUT.total_seconds():.0f} s); a second worker process on the queue",
        happened=f"the round's task timed out and the second worker replayed it, sliced "
        f"locally again and completed it {settled_after:.1f} s after the kill (55 s task "
        f"timeout before: 51.9 s here, 54.5 s in the issue); the user workflow saw every line "
        f"indexed {indexed_after:.1f} s after the kill; {report.fragments} fragments",
        outcome=report,
        started=started,
    )
