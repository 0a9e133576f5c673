"""`mnemoflow replay` on a history exported with the temporal CLI, as docs/OPERATIONS.md says."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.ids import user_workflow_id
from tests.support.drive import conversation, submit, wait_status
from tests.support.memory_worker import memory_worker
from tests.support.temporal import binary


async def test_replay_of_a_cli_exported_history(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"replay-{uuid.uuid4().hex[:6]}"
        lines = ["I'm Vera, order 808.", "Noted, Vera."]
        handle = await submit(
            dev_env.client, mw.task_queue, user, conversation("t", lines, time.time() - 7200)
        )
        await wait_status(handle, lambda s: s.rounds_completed == 1, deadline_s=60)
        workflow_id = user_workflow_id(user)
        address = dev_env.client.service_client.config.target_host
        exported = await asyncio.to_thread(
            subprocess.run,
            [
                binary("temporal"),
                "workflow",
                "show",
                "--workflow-id",
                workflow_id,
                "--output",
                "json",
                "--address",
                address,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        path = tmp_path / "history.json"
        path.write_text(exported.stdout)
    # The CLI as an operator runs it: its own process (a replayer in a thread of this process
    # would share Python's import locks with the live worker's sandbox).
    ok = await asyncio.to_thread(mnemoflow, "replay", str(path), "--workflow-id", workflow_id)
    assert ok.returncode == 0, ok.stderr
    assert "replayed without non-determinism" in ok.stdout
    wrong = await asyncio.to_thread(mnemoflow, "replay", str(path))
    assert wrong.returncode == 1 and "--workflow-id" in wrong.stderr


def mnemoflow(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MNEMOFLOW_", "TEMPORAL_"))}
    return subprocess.run(
        [sys.executable, "-m", "mnemoflow.ops.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
