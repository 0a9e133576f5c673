"""The dev server's SQLite file runs in WAL mode and keeps what it committed across a SIGKILL."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from mnemoflow.devstack.temporal_dev import SQLITE_PRAGMAS, dev_server_argv
from tests.support.temporal import restartable_dev_server

pytestmark = pytest.mark.integration


def test_the_dev_server_is_started_with_the_pragmas() -> None:
    argv = dev_server_argv(7233, None, "t.db", {})
    pairs = [argv[i + 1] for i, a in enumerate(argv) if a == "--sqlite-pragma"]
    assert pairs == [f"{k}={v}" for k, v in SQLITE_PRAGMAS.items()]
    assert "--sqlite-pragma" not in dev_server_argv(7233, None, "t.db", {}, sqlite_pragmas={})


async def test_wal_mode_and_a_started_workflow_survives_a_sigkill(tmp_path: Path) -> None:
    async with restartable_dev_server(tmp_path) as server:
        with sqlite3.connect(f"file:{server.db}?mode=ro", uri=True) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        client = await server.client()
        # No worker polls this queue: the workflow stays running, its start committed.
        handle = await client.start_workflow(
            "NoSuchWorkflow", id="committed-before-the-kill", task_queue="nobody-polls"
        )
        assert server.process is not None
        server.process.popen.kill()  # SIGKILL: no checkpoint, no clean close
        server.process.popen.wait(timeout=30)
        await server.stop()
        await server.start()
        again = await server.client()
        try:
            described = await again.get_workflow_handle(handle.id).describe(
                rpc_timeout=timedelta(seconds=10)
            )
        except RPCError as err:  # pragma: no cover - the failure this test exists to show
            pytest.fail(f"the started workflow was lost with the server: {err}")
        assert described.status == WorkflowExecutionStatus.RUNNING
