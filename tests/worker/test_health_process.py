"""`mnemoflow worker` as Kubernetes runs it: a subprocess configured by environment variables.

Liveness answers before anything is connected, readiness only once Temporal, Milvus and Redis
answer and the Workers poll; /metrics serves the Temporal SDK's metrics and mnemoflow's own after
a round; SIGTERM during a slow activity lets it finish and the process exits 0 in time.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import MarkerRecordedEventAttributes
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.processes import LOOPBACK, ManagedProcess, free_port
from mnemoflow.devstack.temporal_dev import start_temporal_dev
from mnemoflow.models.ids import round_workflow_id, user_workflow_id
from mnemoflow.models.round_store import SLICE_AND_TUNE
from mnemoflow.worker.search_attributes import wanted
from tests.support.drive import conversation, eventually, submit, wait_status
from tests.support.worker_cli import WorkerProcess, get, worker_env

pytestmark = pytest.mark.integration
LINES = [
    "Hello, my name is Ada and I work as a nurse in Leeds.",
    "Welcome Ada! What can I do for you today?",
    "My order number is 55120 and the parcel is late.",
    "Let me look up order 55120.",
]
#: The worker's MNEMOFLOW_GRACEFUL_SHUTDOWN_S in these tests.
GRACEFUL_S = 20.0


def start_worker(
    tmp: Path, temporal: str, milvus_uri: str, redis_url: str, **env: str
) -> WorkerProcess:
    """A `mnemoflow worker` process with its own queue, collection and prefix."""
    settings = worker_env(
        temporal, milvus_uri, redis_url, MNEMOFLOW_GRACEFUL_SHUTDOWN_S=str(GRACEFUL_S), **env
    )
    return WorkerProcess(tmp, settings)


async def test_probes_follow_connection_and_metrics_are_served(
    tmp_path: Path, milvus_uri: str, redis_url: str
) -> None:
    # Temporal is not there yet: the worker must be alive but not ready until it connects.
    port = free_port()
    proc = start_worker(tmp_path, f"{LOOPBACK}:{port}", milvus_uri, redis_url)
    temporal: ManagedProcess | None = None
    try:
        assert (await proc.wait_until("/healthz", 200, deadline_s=60)) == "ok\n"
        body = json.loads(await proc.wait_until("/readyz", 503))
        assert body["ready"] is False
        assert (await get(proc.health_port, "/nope"))[0] == 404

        temporal = await asyncio.to_thread(
            start_temporal_dev, port, None, tmp_path / "temporal.db", wanted()
        )
        body = json.loads(await proc.wait_until("/readyz", 200))
        assert body == {
            "ready": True,
            "checks": {"milvus": "ok", "polling": "ok", "redis": "ok", "temporal": "ok"},
        }

        client = await Client.connect(f"{LOOPBACK}:{port}", data_converter=pydantic_data_converter)
        turns = conversation("thread-1", LINES, time.time() - 3 * 3600)
        user = f"ada-{uuid.uuid4().hex[:6]}"
        handle = await submit(client, proc.task_queue, user, turns, urgent=True)
        await wait_status(handle, lambda s: s.rounds_completed >= 1, deadline_s=90, what="round")
        await _assert_metrics(proc.metrics_port)
    finally:
        proc.stop()
        if temporal is not None:
            temporal.stop()


async def _assert_metrics(port: int) -> None:
    wanted_names = [
        'mnemoflow_rounds_total{outcome="completed"}',
        "mnemoflow_fragments_indexed_total",
        "mnemoflow_injected_context_bytes_bucket",
        'mnemoflow_llm_tokens_total{kind="input",operation="slice"}',
        "mnemoflow_llm_cost_total",
        "mnemoflow_select_seconds_bucket",
        'mnemoflow_activity_seconds_count{activity="mnemoflow.publish",outcome="completed"}',
        "temporal_request_total",
        "temporal_workflow_completed_total",
        "temporal_activity_execution_latency_seconds_bucket",
        "temporal_worker_task_slots_available",
    ]

    async def served() -> bool:
        code, text = await get(port, "/metrics")
        return code == 200 and all(name in text for name in wanted_names)

    try:
        # The SDK's exporter and the round's last workflow task land a moment after the status.
        await eventually(served, deadline_s=30, what="the named metrics")
    except AssertionError:
        text = (await get(port, "/metrics"))[1]
        missing = [n for n in wanted_names if n not in text]
        names = sorted(
            {
                line.split("{")[0].split(" ")[0]
                for line in text.splitlines()
                if line.startswith("temporal_")
            }
        )
        raise AssertionError(f"missing {missing} in {names}") from None


def local_attempts(metrics: str, activity_type: str) -> float:
    """Local activities of `activity_type` the SDK handed to this worker's code, from its
    Prometheus text: the SDK's `local_activity_total` counter (the exporter appends `_total`
    to counters, so it reads `temporal_local_activity_total_total`), one sample per label set."""
    label = f'activity_type="{activity_type}"'
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if re.match(r"temporal_local_activity_total(_total)?\{", line) and label in line
    )


def local_activity_type(marker: MarkerRecordedEventAttributes) -> str | None:
    """The activity type a local activity's marker records (its JSON `data` detail), or None
    for another marker (a patch)."""
    if marker.marker_name != "core_local_activity":
        return None
    data = json.loads(marker.details["data"].payloads[0].data)
    return str(data["activity_type"])


async def test_sigterm_lets_a_slow_activity_finish_and_exits_zero(
    tmp_path: Path, dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    address = dev_env.client.service_client.config.target_host
    # Every heuristic model call: long enough that a loaded machine still sees the drain (readyz
    # 503 before exit), far below the graceful shutdown timeout.
    slow = 8.0
    proc = start_worker(
        tmp_path, address, milvus_uri, redis_url, MNEMOFLOW_HEURISTIC_LATENCY_S=str(slow)
    )
    try:
        await proc.wait_until("/readyz", 200)
        client = dev_env.client
        user = f"slow-{uuid.uuid4().hex[:6]}"
        turns = conversation("thread-1", LINES, time.time() - 3 * 3600)
        await submit(client, proc.task_queue, user, turns, urgent=True)
        round_handle = client.get_workflow_handle(round_workflow_id(user_workflow_id(user), 1))

        async def slicing() -> bool:
            """The worker runs the slice: the round's local attempt (round shape 3 and later,
            the LLM activities on the workflow queue), counted by the SDK when it hands the
            attempt to the worker's code. What the server shows is not enough: it marks the
            round's workflow task started when it hands it to a poll, and a SIGTERM that lands
            before that poll's answer reaches the worker ends the poll and drops the task
            (the SDK interrupts long polls at shutdown); the round then runs on the next
            worker once the task times out, with nothing in flight here to finish."""
            code, text = await get(proc.metrics_port, "/metrics")
            return code == 200 and local_attempts(text, SLICE_AND_TUNE) >= 1

        await eventually(slicing, deadline_s=60, what="the slice to start")
        started = time.monotonic()
        proc.popen.send_signal(signal.SIGTERM)
        await proc.wait_until("/readyz", 503, deadline_s=5)  # draining: no longer ready
        rc = await proc.exit_code(GRACEFUL_S + 10)
        took = time.monotonic() - started
        assert rc == 0, proc.log()
        assert took < GRACEFUL_S, f"took {took:.1f}s"

        events = [e async for e in round_handle.fetch_history_events()]
        kinds = [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events]
        # The attempt that ran at SIGTERM finished and was recorded: its marker, not a failure.
        markers = [
            e.marker_recorded_event_attributes
            for e in events
            if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        ]
        sliced = [m for m in markers if local_activity_type(m) == SLICE_AND_TUNE]
        assert sliced, f"the in-flight slice did not complete before exit: {kinds}\n{proc.log(0)}"
        assert not sliced[0].HasField("failure"), sliced[0].failure
        assert not any(
            e.event_type
            in (
                EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
                EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
                EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
                EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
            )
            for e in events
        ), kinds
        assert "shutting down gracefully" in proc.log()
    finally:
        proc.stop()
