"""Split worker roles as deployed: `mnemoflow worker` twice, role=workflow and role=llm.

Two OS processes configured only by environment variables, on split task queues with the LLM
queue rate limited (enforced by the server). Rounds complete through them; then both get SIGTERM
while LLM calls are running (the heuristic models' latency keeps them in flight). Both exit 0,
the in-flight calls finish or are retried once, and after restarting the processes every
distinct message said is indexed exactly once.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.models.contracts import ActivityName, UserStatus
from mnemoflow.models.round_store import SLICE_AND_TUNE
from mnemoflow.models.turns import ChatTurn
from tests.support.drive import eventually
from tests.support.invariants import Outcome, indexed_once, no_messages
from tests.support.reliability import Ledger
from tests.support.replay import assert_replays
from tests.support.worker_cli import WorkerProcess, worker_env

pytestmark = pytest.mark.integration

LLM_ACTIVITIES = {ActivityName.SLICE, ActivityName.TUNE, ActivityName.INDUCT, SLICE_AND_TUNE}
USERS = 3
THREAD = "t1"
#: Seconds each heuristic model call takes: long enough to SIGTERM during one.
LATENCY_S = 3.0
GRACEFUL_S = 20.0


def said(user: str, start: int, count: int, t0: float) -> list[ChatTurn]:
    """Distinct turns: every human line carries a code no other line has."""
    turns = []
    for pos in range(start, start + count):
        human = pos % 2 == 0
        code = f"{user}-{pos}"
        text = (
            f"My order number is {code} and it has not arrived."
            if human
            else f"Checking {code} now."
        )
        turns.append(
            ChatTurn(
                thread_id=THREAD,
                position=pos,
                role="human" if human else "ai",
                content=text,
                time=t0 + pos * 35.0,
            )
        )
    return turns


async def all_indexed(memory: MemoryClient, users: list[str], end: int) -> dict[str, UserStatus]:
    """Wait until each user's thread is accepted and indexed up to `end`, nothing running."""
    found: dict[str, UserStatus] = {}

    async def caught_up() -> bool:
        for user in users:
            try:
                status = await memory.status(user, timeout_s=5)
            except Exception:
                return False  # a query may time out while a worker restarts
            mark = status.watermarks.get(THREAD) if status else None
            if status is None or mark is None or not mark.accepted == mark.indexed == end:
                return False
            if any(r.status == "running" for r in status.rounds):
                return False
            found[user] = status
        return True

    await eventually(caught_up, deadline_s=180, what=f"every message up to {end} indexed")
    return found


async def assert_stored_once(
    store: FragmentStore, statuses: dict[str, UserStatus], end: int
) -> Outcome:
    """Every message of every user in exactly one fragment; returns what was counted."""
    total = no_messages()
    for user, status in statuses.items():
        outcome = await indexed_once(store, user, status, {THREAD: end})
        assert outcome.clean, (user, outcome)
        assert status.rounds_failed == 0, status.last_error
        contents = [f.content for f in await store.all_for_user(user)]
        for pos in range(0, end, 2):
            line = f"order number is {user}-{pos} "
            assert sum(c.count(line) for c in contents) == 1, (user, pos, contents)
        total += outcome
    return total


async def llm_calls_running(client: Client, round_ids: list[str]) -> set[tuple[str, str]]:
    """(workflow id, activity id) of the LLM activities a worker is running right now."""
    running = set()
    for workflow_id in round_ids:
        try:
            desc = await client.get_workflow_handle(workflow_id).describe()
        except Exception:
            continue
        for p in desc.raw_description.pending_activities:
            started = p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            if started and p.activity_type.name in LLM_ACTIVITIES:
                running.add((workflow_id, p.activity_id))
    return running


async def llm_attempts(client: Client, workflow_ids: list[str]) -> dict[tuple[str, str], int]:
    """(workflow id, activity id) -> the attempt that finished, for every LLM activity."""
    attempts = {}
    for workflow_id in workflow_ids:
        events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
        scheduled = {
            e.event_id: e.activity_task_scheduled_event_attributes
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        }
        for e in events:
            if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                continue
            attrs = e.activity_task_started_event_attributes
            act = scheduled[attrs.scheduled_event_id]
            if act.activity_type.name in LLM_ACTIVITIES:
                attempts[(workflow_id, act.activity_id)] = attrs.attempt
    return attempts


async def llm_activity_types(client: Client, workflow_ids: list[str]) -> dict[str, list[str]]:
    """workflow id -> the type of every LLM activity it scheduled, in order."""
    kinds: dict[str, list[str]] = {}
    for workflow_id in workflow_ids:
        events = [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]
        kinds[workflow_id] = [
            e.activity_task_scheduled_event_attributes.activity_type.name
            for e in events
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name in LLM_ACTIVITIES
        ]
    return kinds


async def test_split_roles_complete_rounds_and_survive_sigterm_mid_llm_call(
    tmp_path: Path,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    client = dev_env.client
    address = client.service_client.config.target_host
    env = worker_env(
        address,
        milvus_uri,
        redis_url,
        MNEMOFLOW_HEURISTIC_LATENCY_S=str(LATENCY_S),
        MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND="20",
        MNEMOFLOW_GRACEFUL_SHUTDOWN_S=str(GRACEFUL_S),
    )
    env["TEMPORAL_LLM_TASK_QUEUE"] = llm_queue = f"{env['TEMPORAL_TASK_QUEUE']}-llm"

    def start_roles() -> list[WorkerProcess]:
        return [
            WorkerProcess(tmp_path, {**env, "MNEMOFLOW_WORKER_ROLE": role}, role)
            for role in ("workflow", "llm")
        ]

    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=env["MILVUS_COLLECTION"])
    memory = MemoryClient(
        temporal=client,
        task_queue=env["TEMPORAL_TASK_QUEUE"],
        llm_task_queue=llm_queue,
        redis=redis_url,
        key_prefix=env["REDIS_KEY_PREFIX"],
    )
    users = [f"role-{uuid.uuid4().hex[:6]}-{i}" for i in range(USERS)]
    t0 = time.time() - 3 * 3600
    procs = start_roles()
    try:
        for proc in procs:
            await proc.wait_until("/readyz", 200)
        assert "polling ['" + env["TEMPORAL_TASK_QUEUE"] + "']" in procs[0].log(0)
        assert f"polling ['{llm_queue}']" in procs[1].log(0)

        # Rounds complete through the two processes.
        for user in users:
            await memory.submit(user, said(user, 0, 6, t0), urgent=True)
        statuses = await all_indexed(memory, users, 6)
        await assert_stored_once(store, statuses, 6)

        # More turns; SIGTERM both processes while LLM calls run.
        for user in users:
            await memory.submit(user, said(user, 6, 6, t0), urgent=True)
        in_flight: set[tuple[str, str]] = set()

        async def llm_in_flight() -> bool:
            round_ids = set()
            for user in users:
                status = await memory.status(user, timeout_s=5)
                rounds = status.rounds if status is not None else []
                round_ids.update(r.workflow_id for r in rounds if r.round_no > 1)
            in_flight.update(await llm_calls_running(client, sorted(round_ids)))
            return bool(in_flight)

        await eventually(llm_in_flight, deadline_s=60, what="an LLM call of a second round")
        for proc in procs:
            proc.popen.send_signal(signal.SIGTERM)
        codes = await asyncio.gather(*(p.exit_code(GRACEFUL_S + 15) for p in procs))
        assert codes == [0, 0], [p.log() for p in procs]
        assert all("worker stopped" in p.log(0) for p in procs)

        # Restarted, the processes finish everything; nothing lost, nothing twice.
        for proc in procs:
            proc.stop()
        procs = start_roles()
        statuses = await all_indexed(memory, users, 12)
        outcome = await assert_stored_once(store, statuses, 12)
        workflow_ids = [r.workflow_id for s in statuses.values() for r in s.rounds]
        workflow_ids += [memory.workflow_id(u) for u in users]
        attempts = await llm_attempts(client, workflow_ids)
        # The chart's layout makes one LLM activity a round (shape 6): the slice, the stored
        # weights and the tunes of new themes together, never a slice and a tune apart.
        round_ids = [r.workflow_id for s in statuses.values() for r in s.rounds]
        kinds = await llm_activity_types(client, round_ids)
        assert kinds == {w: [SLICE_AND_TUNE] for w in round_ids}, kinds
        user_ids = [memory.workflow_id(u) for u in users]
        assert await assert_replays(client, user_ids[:1], name="split-user") == 1
        first = [r.workflow_id for r in statuses[users[0]].rounds]
        assert await assert_replays(client, first, name="round-split") == len(first)
        assert in_flight <= attempts.keys(), "an in-flight LLM call never finished"
        assert max(attempts.values()) <= 2, {k: v for k, v in attempts.items() if v > 1}
        retried = sum(1 for v in attempts.values() if v > 1)
        reliability.record(
            request,
            key="split-roles-sigterm",
            kind="fault",
            what="mnemoflow worker as two processes (role=workflow, role=llm, split queues, "
            f"rate limit) sent SIGTERM while {len(in_flight)} LLM call(s) ran; then restarted",
            happened=f"both exited 0; in-flight calls finished; {len(attempts)} LLM calls, "
            f"{retried} retried once; {outcome.said} messages in {outcome.fragments} fragments",
            outcome=outcome,
            started=started,
        )
    finally:
        for proc in procs:
            proc.stop()
        for user in users:
            try:
                await client.get_workflow_handle(memory.workflow_id(user)).terminate("test done")
            except Exception:
                pass
        await memory.aclose()
        await store.drop()
        await store.close()
