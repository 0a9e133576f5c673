"""`mnemoflow demo` end to end: its own embedded stack, the story, the summary, exit 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mnemoflow.devstack.processes import free_port


def test_demo_runs_the_story_and_writes_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DEEPSEEK_", "MNEMOFLOW_"))}
    argv = [
        sys.executable,
        "-m",
        "mnemoflow.ops.cli",
        "demo",
        "--data-dir",
        str(tmp_path / "data"),
        "--out",
        str(out),
        "--temporal-port",
        str(free_port()),
        "--ui-port",
        str(free_port()),
        "--redis-port",
        str(free_port()),
        "--milvus-port",
        str(free_port()),
    ]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== mnemoflow demo summary ==" in done.stdout
    summary = json.loads(out.read_text())
    assert summary["models"] == "heuristic"
    assert summary["rounds"]["completed"] >= 1 and summary["rounds"]["failed"] == 0
    assert summary["fragments_stored"] > 0 and summary["inductions"] >= 1
    assert summary["profile"]["name"] == "Maya Chen"
    # Memory must deliver every detail; the toy chat model must read most of them back.
    assert summary["details_in_injected_context_across_sessions"] == "8/8"
    assert int(summary["recall_across_sessions"].split("/")[0]) >= 6
    assert summary["temporal_ui"].startswith("http://127.0.0.1:")
    assert summary["ledger"]["by_operation"]["slice"]["calls"] >= 1
    # Every chat call's tokens reached the user's ledger with the hand-overs, once.
    assert summary["ledger"]["chat"]["calls"] == summary["chat_model_calls"] > 0
    assert "chat model tokens" in done.stdout
