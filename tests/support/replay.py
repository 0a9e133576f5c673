"""Replay of recorded histories: every end-to-end workflow test replays its own histories.

Set MNEMOFLOW_RECORD_REPLAY=1 to also write them under tests/replay/ (committed on purpose
when a workflow changes), where tests/workflows/test_replay.py replays them on every run.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DataConverter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
from mnemoflow.workflows.user_memory import UserMemoryWorkflow

REPLAY_DIR = Path(__file__).resolve().parent.parent / "replay"


def replayer(*, sandboxed: bool = True, converter: DataConverter | None = None) -> Replayer:
    """A replayer with both workflows and the project's data converter (or `converter`)."""
    return Replayer(
        workflows=[UserMemoryWorkflow, MemoryRoundWorkflow],
        data_converter=converter or pydantic_data_converter,
        workflow_runner=SandboxedWorkflowRunner() if sandboxed else UnsandboxedWorkflowRunner(),
    )


async def assert_replays(client: Client, workflow_ids: list[str], *, name: str) -> int:
    """Fetch the histories of these workflows and replay them; raises on non-determinism."""
    histories: list[WorkflowHistory] = []
    for workflow_id in workflow_ids:
        histories.append(await client.get_workflow_handle(workflow_id).fetch_history())
    # Unsandboxed: a sandbox built here while the test's live worker builds its own can deadlock
    # on Python's import locks (seen once). The live worker runs sandboxed, which is what
    # catches forbidden calls; the replay only has to compare commands with the history.
    replay = replayer(sandboxed=False)
    for history in histories:
        await replay.replay_workflow(history)
    if os.environ.get("MNEMOFLOW_RECORD_REPLAY"):
        REPLAY_DIR.mkdir(parents=True, exist_ok=True)
        for i, history in enumerate(histories):
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{name}-{i}")
            record = {"workflow_id": history.workflow_id, "history": json.loads(history.to_json())}
            (REPLAY_DIR / f"{safe}.json").write_text(json.dumps(record) + "\n")
    return len(histories)


def load_recorded(path: Path) -> WorkflowHistory:
    """A committed history with the workflow id it was recorded under."""
    record = json.loads(path.read_text())
    return WorkflowHistory.from_json(record["workflow_id"], record["history"])
