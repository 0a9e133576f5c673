"""Process faults on the dev server with real workers, redis-server and Milvus Lite.

- A worker process killed with SIGKILL while its index activity runs, a second worker process on
  the same task queue: the activity's heartbeat times out, the second worker retries it, the
  round completes and every message is indexed once.
- The Temporal dev server stopped and restarted on its SQLite file mid-conversation: hand-overs
  made while it is down fail fast (the middleware re-sends them on the next turn), the client
  and the in-process worker reconnect on their own, and nothing is lost or duplicated.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import LOOPBACK, free_port
from mnemoflow.devstack.temporal_dev import start_temporal_dev
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.contracts import ActivityName, UserStatus
from mnemoflow.models.errors import MemoryUnavailableError
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.models.round_store import STORE_ROUND
from mnemoflow.worker.search_attributes import wanted
from tests.support.drive import STARTED, conversation, eventually, status, submit, wait_status
from tests.support.invariants import Monotonic, indexed_once
from tests.support.memory_worker import memory_worker, terminate_started
from tests.support.reliability import Ledger
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
HOUR = 3600.0
LINES = [
    "Hi, I'm Ada Lovelace, a data engineer in Leeds.",
    "Welcome Ada, how can I help?",
    "My order number is 7734-221 and it has not arrived.",
    "Checking order 7734-221 now.",
    "I prefer email to phone calls, and I'm busy on Wednesdays.",
    "Noted: email, never on Wednesdays.",
    "My cat Pixel chewed the last parcel's box.",
    "Poor box! I'll note that too.",
]


async def activity_running(client: Client, round_id: str, name: str) -> bool:
    """True while the round's activity `name` is started on some worker."""
    try:
        desc = await client.get_workflow_handle(round_id).describe()
    except Exception:
        return False
    return any(
        p.activity_type.name == name
        and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        for p in desc.raw_description.pending_activities
    )


#: Which activity the first worker is slowed in (and killed during): the index activity (a store
#: write) or the slice activity (an LLM call). Both heartbeat, so either is retried in seconds.
KILLED_DURING = {
    # A lean round indexes in its store step: after its local attempts, an activity.
    STORE_ROUND: ("worker-sigkill", {"slow_index_s": 120}),
    ActivityName.SLICE: ("worker-sigkill-llm", {"slow_llm_s": 120}),
}


@pytest.mark.parametrize("killed_during", list(KILLED_DURING))
async def test_worker_killed_mid_activity_second_worker_completes_the_round(
    killed_during: str,
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
    task_queue, collection, prefix = f"tq-kill-{tag}", f"t_kill_{tag}", f"test:{tag}:"
    address = client.service_client.config.target_host
    # The round's local attempts (slice and store) give up after 2 s instead of the production
    # 30 s and 10 s: the ordinary activity, killed and retried here, is under way sooner.
    common = dict(
        address=address, task_queue=task_queue, milvus=milvus_uri, redis=redis_url,
        collection=collection, prefix=prefix, local_llm_bound_s=2.0, local_store_bound_s=2.0,
    )  # fmt: skip
    store = FragmentStore(uri=milvus_uri, embeddings=HashingEmbeddings(), collection=collection)
    user = f"kill-{tag}"
    watch = Monotonic()
    try:
        key, slowed = KILLED_DURING[killed_during]
        with worker_process(tmp_path, "slow", **slowed, **common) as slow:  # type: ignore[arg-type]
            t0 = time.time() - 3 * HOUR
            handle = await submit(
                client, task_queue, user, conversation("t", LINES, t0), urgent=True
            )
            running = await wait_status(
                handle, lambda s: watch.see(s) and bool(s.rounds), what="round started"
            )
            round_id = running.rounds[-1].workflow_id
            await eventually(
                lambda: activity_running(client, round_id, killed_during),
                deadline_s=60,  # the round's local attempts first (2 s)
                what=f"{killed_during} activity",
            )
            with worker_process(tmp_path, "second", **common):  # type: ignore[arg-type]
                os.kill(slow.pid, signal.SIGKILL)
                killed_at = time.monotonic()
                slow.wait(timeout=10)
                # Queries go to the dead worker's sticky queue until the server gives up on it
                # (seconds), so a status query may time out meanwhile.
                box: dict[str, UserStatus] = {}

                async def completed() -> bool:
                    try:
                        box["s"] = await status(handle)
                    except RPCError:
                        return False
                    return watch.see(box["s"]) and box["s"].rounds_completed == 1

                # Well under the LLM start-to-close (2 min): only the heartbeat gets it there.
                await eventually(completed, deadline_s=60, what="round completed elsewhere")
                completed_after = time.monotonic() - killed_at
                history = await client.get_workflow_handle(round_id).fetch_history()
                attempts = [
                    e.activity_task_started_event_attributes.attempt
                    for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                ]
                assert max(attempts) >= 2, f"the {killed_during} activity was not retried"
                # The agent's next turns still work: they are handed over and indexed.
                more = conversation("t", [*LINES, "One more thing: ship to 12 Mill Lane."], t0)
                await submit(client, task_queue, user, more[len(LINES) :], urgent=True)
                done = await wait_status(
                    handle,
                    lambda s: watch.see(s) and s.watermarks["t"].indexed == len(more),
                    deadline_s=60,
                    what="next turn indexed",
                )
                outcome = await indexed_once(store, user, done, {"t": len(more)})
                assert done.rounds_failed == 0
                assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
                await terminate_started(client, task_queue)
    finally:
        STARTED.pop(task_queue, None)
        await store.drop()
        await store.close()
    reliability.record(
        request,
        key=key,
        kind="fault",
        what=f"Worker process killed with SIGKILL while its {killed_during} activity ran; a "
        "second worker process on the same task queue",
        happened=f"{killed_during} heartbeat timed out (10 s), attempt {max(attempts)} ran on "
        f"the second worker; round completed {completed_after:.0f} s after the kill, "
        f"{outcome.fragments} fragments; the next turn was indexed",
        outcome=outcome,
        started=started,
    )


async def test_temporal_dev_server_restarted_mid_conversation(
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    # The server stops while the round of turns 4-6 holds its workflow task: the worker's
    # completion is lost, and the restarted server hands the task out again only once it has
    # timed out (ROUND_TASK_TIMEOUT, 10 s).
    port, db = free_port(), tmp_path / "temporal.db"
    server = await asyncio.to_thread(start_temporal_dev, port, None, db, wanted())
    try:
        client = await Client.connect(f"{LOOPBACK}:{port}", data_converter=pydantic_data_converter)
        async with memory_worker(
            client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
        ) as mw:
            memory = MemoryClient(temporal=client, task_queue=mw.task_queue, signal_timeout_s=2.0)
            user = f"restart-{uuid.uuid4().hex[:8]}"
            mw.track(user_workflow_id(user))
            watch = Monotonic()
            turns = conversation("t", LINES, time.time() - 3 * HOUR)

            async def indexed(end: int) -> bool:
                try:
                    s = await memory.status(user)
                except MemoryUnavailableError:
                    return False  # the server or the worker is still coming back
                return bool(s and watch.see(s) and s.watermarks["t"].indexed >= end)

            await memory.submit(user, turns[:4], urgent=True)
            await eventually(lambda: indexed(4), deadline_s=60, what="first half indexed")
            await memory.submit(user, turns[4:6], urgent=True)
            await asyncio.to_thread(server.stop)
            with pytest.raises(MemoryUnavailableError):
                await memory.submit(user, turns[6:], urgent=True)  # the turn goes on
            server = await asyncio.to_thread(start_temporal_dev, port, None, db, wanted())
            # What the middleware does on the next turn: re-send everything not accepted.
            await memory.submit(user, turns[4:], urgent=True)
            await eventually(
                lambda: indexed(len(LINES)), deadline_s=60, what="all indexed after restart"
            )
            status = await memory.status(user)
            assert status is not None and status.rounds_failed == 0
            outcome = await indexed_once(mw.store, user, status, {"t": len(LINES)})
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
            await memory.aclose()
    finally:
        await asyncio.to_thread(server.stop)
    reliability.record(
        request,
        key="temporal-restart",
        kind="fault",
        what="Temporal dev server stopped and restarted on its SQLite file mid-conversation",
        happened="a hand-over while it was down failed fast with MemoryUnavailableError (the "
        "turn goes on, the next turn re-sends); client and in-process worker reconnected on "
        f"their own; {outcome.rounds} rounds completed, {outcome.fragments} fragments",
        outcome=outcome,
        started=started,
    )
