"""benchmarks/round_floor.py end to end, small: the production shape and the chart's layout
(`production_split`) on a dev server of their own, each round through the production client
path and the production workflows, every activity a no-op.

What the floor beside the split layout's rounds stands on: in the chart's layout the round's
slice-and-tune must be an ordinary activity served by the LLM queue's Worker (one activity and a
second workflow task in every round), and at dev defaults a local activity (no activity, one
workflow task). A floor whose rounds never reached the LLM queue would read the dev layout's
history as the chart's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
USERS, ROUNDS = 3, 2


def test_the_split_floor_runs_its_llm_step_on_the_llm_queue(tmp_path: Path) -> None:
    out = tmp_path / "round_floor.json"
    env = {**os.environ, "MNEMOFLOW_BENCH_OUT": str(out)}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "round_floor.py"),
            "--users",
            str(USERS),
            "--rounds",
            str(ROUNDS),
            "--shapes",
            "production,production_split",
            "--llm-rate",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    phases = {p["shape"]: p for p in result["phases"]}
    assert list(phases) == ["production", "production_split"]
    for phase in phases.values():
        assert phase["rounds_ended"] == phase["rounds"] == USERS * ROUNDS
        assert phase["history_per_round"]["parent"]["activities"] == 0
    dev = phases["production"]["history_per_round"]["child"]
    split = phases["production_split"]["history_per_round"]["child"]
    assert dev["activities"] == 0 and dev["workflow_tasks"] == 1.0
    assert split["activities"] == 1.0 and split["workflow_tasks"] == 2.0
    assert phases["production_split"]["llm_activities_per_second"] == 0
    assert "production_split" in done.stdout
