"""`mnemoflow replay FILE --workflow-id ID`: replay a recorded history against this code.

Get the history with `temporal workflow show --workflow-id ID --output json > FILE` (add
`--codec-endpoint` when payloads are encrypted, or configure the same keys here). A clean replay
means the current workflow code can take over that execution; a NondeterminismError names the
first event where code and history disagree, which is the place to add `workflow.patched()`.
"""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from mnemoflow.worker.codec import data_converter
from mnemoflow.worker.settings import Settings
from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
from mnemoflow.workflows.user_memory import UserMemoryWorkflow


def load_history(path: Path, workflow_id: str) -> WorkflowHistory:
    """A history file as the temporal CLI writes it ({"events": [...]}), or a bare event list."""
    raw = json.loads(path.read_text())
    if isinstance(raw, list):
        raw = {"events": raw}
    if "history" in raw and "events" not in raw:  # the project's own recordings
        workflow_id = workflow_id or raw.get("workflow_id", "")
        raw = raw["history"]
    if not workflow_id:
        raise ValueError("pass --workflow-id: child ids derive from it, replay needs the real one")
    return WorkflowHistory.from_json(workflow_id, raw)


async def replay_file(settings: Settings, path: Path, workflow_id: str) -> str:
    """Replay one history file; returns a one-line verdict or raises on non-determinism."""
    history = load_history(path, workflow_id)
    replayer = Replayer(
        workflows=[UserMemoryWorkflow, MemoryRoundWorkflow],
        data_converter=data_converter(settings.temporal.encryption),
    )
    await replayer.replay_workflow(history)
    return f"{history.workflow_id}: {len(history.events)} events replayed without non-determinism"
