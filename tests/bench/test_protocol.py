"""The benchmark protocol (benchmarks/_protocol.py) without a benchmark: a repeat's process tree
is counted with its children apart, a repeat spoiled by other work is left out of the median,
and a run where every repeat was spoiled says so."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _protocol


def _row(others_cores: float, cpu: float, rate: float) -> dict[str, Any]:
    return {
        "others_cores": others_cores,
        "excluded": others_cores > _protocol.OTHERS_LIMIT_CORES,
        "figures": {
            "phases.-1.rounds_per_s": rate,
            "phases.-1.cpu_ms_per_round_all": cpu,
        },
    }


def _result(cpu: float, rate: float, tag: str) -> dict[str, Any]:
    return {
        "phases": [{"rounds_per_s": rate, "cpu_ms_per_round_all": cpu, "sqlite": tag}],
        "events": [1, 2, 3],
    }


def test_a_busy_repeat_is_left_out_of_the_median() -> None:
    rows = [_row(0.02, 70.0, 24.0), _row(0.9, 300.0, 6.0), _row(0.05, 74.0, 23.0)]
    results = [_result(70.0, 24.0, "a"), _result(300.0, 6.0, "b"), _result(74.0, 23.0, "c")]
    merged = _protocol.merge("throughput", rows, results)
    assert merged["phases"][0]["cpu_ms_per_round_all"] == 72.0
    assert merged["phases"][0]["rounds_per_s"] == 23.5
    assert merged["phases"][0]["sqlite"] == "a"
    assert merged["events"] == [1, 2, 3]
    p = merged["protocol"]
    assert p["quiet"] is True and p["repeats_in_median"] == [1, 3]
    assert p["spread"]["phases.-1.cpu_ms_per_round_all"] == round(4 / 72, 3)
    # the spoiled repeat is still on record, and the CPU spread over all repeats shows it
    assert p["repeats"][1]["excluded"] is True
    assert p["cpu_spread_all_repeats"] == round((300 - 70) / 74, 3)


def test_the_calibration_before_and_after_each_repeat_is_kept_in_order() -> None:
    rows = [_row(0.0, 70.0, 24.0), _row(0.0, 80.0, 22.0)]
    rows[0]["calibration_cpu_ms"] = {"before": 40.0, "after": 41.5}
    rows[1]["calibration_cpu_ms"] = {"before": 41.6, "after": 47.0}
    results = [_result(70.0, 24.0, "a"), _result(80.0, 22.0, "b")]
    merged = _protocol.merge("throughput", rows, results)
    assert merged["protocol"]["calibration_cpu_ms"] == [40.0, 41.5, 47.0]
    # rows recorded before the calibration existed: none, not a made-up figure
    assert (
        _protocol.merge("throughput", [_row(0.0, 70.0, 24.0)], results[:1])["protocol"][
            "calibration_cpu_ms"
        ]
        is None
    )


def test_each_repeats_calibration_is_kept_beside_it() -> None:
    rows = [_row(0.0, 70.0, 24.0), _row(0.0, 80.0, 22.0)]
    rows[0]["calibration_cpu_ms"] = {"before": 40.0, "after": 52.5}
    rows[1]["calibration_cpu_ms"] = {"before": 42.0, "after": 47.0}
    results = [_result(70.0, 24.0, "a"), _result(80.0, 22.0, "b")]
    p = _protocol.merge("throughput", rows, results)["protocol"]
    assert p["calibration_by_repeat_cpu_ms"] == [[40.0, 52.5], [42.0, 47.0]]
    assert p["settle_tolerance"] == _protocol.SETTLE_TOLERANCE


class _FakeMachine:
    """A machine whose calibration reads from a list, with a clock that sleeping moves."""

    def __init__(self, readings: list[float]) -> None:
        self.readings = list(readings)
        self.now = 0.0
        self.slept: list[float] = []

    def measure(self) -> float:
        return self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def clock(self) -> float:
        return self.now


def _settle(machine: _FakeMachine, baseline: float, max_s: float = 60.0) -> tuple[float, float]:
    return _protocol.settle(
        baseline,
        tolerance=0.1,
        max_s=max_s,
        step_s=10.0,
        measure=machine.measure,
        sleep=machine.sleep,
        clock=machine.clock,
    )


def test_settling_waits_until_the_machine_is_back_to_its_first_speed() -> None:
    fast = _FakeMachine([21.5])
    assert _settle(fast, 20.0) == (21.5, 0.0)  # within 10 %: no wait
    assert fast.slept == []
    slow = _FakeMachine([28.9, 26.0, 23.0, 21.9, 20.0])
    assert _settle(slow, 20.0) == (21.9, 30.0)  # the first reading within 10 % ends it
    assert slow.slept == [10.0, 10.0, 10.0]


def test_settling_gives_up_after_its_bound() -> None:
    stuck = _FakeMachine([30.0])
    last, waited = _settle(stuck, 20.0, max_s=35.0)
    assert (last, waited) == (30.0, 30.0)  # a fourth step would pass the bound
    assert stuck.slept == [10.0, 10.0, 10.0]


def test_the_first_window_times_the_workload_once_a_step() -> None:
    recovering = _FakeMachine([30.0, 24.0, 19.5, 19.8])
    readings = _protocol.first_baseline(
        window_s=30.0, step_s=10.0, measure=recovering.measure, sleep=recovering.sleep
    )
    assert readings == [30.0, 24.0, 19.5, 19.8]
    assert recovering.slept == [10.0, 10.0, 10.0]


def test_the_first_repeat_waits_for_the_fastest_speed_of_the_first_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A benchmark started on a host the previous one slowed: the first repeat waits as the
    others do, for the fastest speed the window saw, not for the slow one it started on."""
    baselines: list[float] = []

    def settle(baseline: float) -> tuple[float, float]:
        baselines.append(baseline)
        return 20.1, 10.0

    def run_repeat(script: Path, argv: list[str], out: Path) -> dict[str, Any]:
        out.write_text(json.dumps(_result(70.0 + len(baselines), 24.0, "a")))
        return {**_row(0.0, 70.0, 24.0), "exit_code": 0, "wall_s": 1.0}

    monkeypatch.setattr(_protocol, "first_baseline", lambda: [30.0, 19.5, 21.0, 20.0])
    monkeypatch.setattr(_protocol, "settle", settle)
    monkeypatch.setattr(_protocol, "run_repeat", run_repeat)
    monkeypatch.setattr(_protocol, "calibrate", lambda: 22.0)
    memory = iter([90.0, 130.0, 95.0, 99.0])
    monkeypatch.setattr(_protocol, "calibrate_memory", lambda: next(memory))
    merged = _protocol.protocol("throughput", [], repeats=2)
    # the memory-bound workload, timed before and after each repeat, is kept beside it
    assert merged["protocol"]["calibration_memory_by_repeat_cpu_ms"] == [
        [90.0, 130.0],
        [95.0, 99.0],
    ]
    assert baselines == [19.5, 19.5]
    first, second = merged["protocol"]["repeats"]
    assert first["calibration_first_window_cpu_ms"] == [30.0, 19.5, 21.0, 20.0]
    assert first["calibration_cpu_ms"] == {"before": 20.1, "after": 22.0}
    assert first["settle_s"] == 10.0 + _protocol.FIRST_WINDOW_S
    assert second["settle_s"] == 10.0
    assert "calibration_first_window_cpu_ms" not in second


def test_the_memory_calibration_waits_on_memory_not_on_the_core() -> None:
    """A read costs several times more when the reads wander over 64 MB than over a few hundred
    KB that the caches hold: the workload times memory, not the core."""
    n = _protocol.MEMORY_CALIBRATION_N
    spread_out = _protocol.gather_s(3, n) / n
    in_cache = _protocol.gather_s(20, n // 100) / (n // 100)
    assert spread_out > 2 * in_cache, (spread_out, in_cache)
    assert _protocol.calibrate_memory(runs=1) > 0


def test_the_calibration_counts_this_threads_cpu_time() -> None:
    """It times the fixed workload in CPU time: four times the work costs more than twice."""
    small = _protocol.calibrate(runs=3)
    assert small > 0
    saved = _protocol.CALIBRATION_N
    try:
        _protocol.CALIBRATION_N = saved * 4
        assert _protocol.calibrate(runs=3) > 2 * small
    finally:
        _protocol.CALIBRATION_N = saved


def test_when_every_repeat_is_busy_the_median_of_all_is_marked() -> None:
    rows = [_row(0.5, 100.0, 10.0), _row(0.6, 120.0, 9.0), _row(0.7, 110.0, 9.5)]
    results = [_result(100.0, 10.0, "a"), _result(120.0, 9.0, "b"), _result(110.0, 9.5, "c")]
    merged = _protocol.merge("throughput", rows, results)
    assert merged["protocol"]["quiet"] is False
    assert merged["protocol"]["repeats_in_median"] == [1, 2, 3]
    assert merged["phases"][0]["cpu_ms_per_round_all"] == 110.0


def test_median_keeps_the_shape_of_one_result() -> None:
    runs = [{"a": 1, "b": [1.25, 3], "c": "x", "d": True}, {"a": 4, "b": [2.5, 5], "c": "y"}]
    # numbers rounded as finely as the inputs are
    assert _protocol.median_of(runs) == {"a": 2.5, "b": [1.88, 4], "c": "x", "d": True}
    assert _protocol.median_of([[1, 2], [1, 2, 3]]) == [1, 2]


def test_a_repeat_counts_its_children_apart(tmp_path: Path) -> None:
    """The repeat's process and a child it starts are both in our CPU, each under its own
    label; the figures the script wrote are read back."""
    script = tmp_path / "bench.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, subprocess, sys, time
            spin = (
                "import time\\nend = time.process_time() + 1.2\\n"
                "while time.process_time() < end: pass"
            )
            child = subprocess.Popen([sys.executable, "-c", spin])
            end = time.process_time() + 0.6
            while time.process_time() < end:
                pass
            child.wait()
            with open(os.environ["MNEMOFLOW_BENCH_OUT"], "w") as f:
                json.dump({"phases": [{"rounds_per_s": 1.0}]}, f)
            """
        )
    )
    out = tmp_path / "out.json"
    row = _protocol.run_repeat(script, [], out)
    assert row["exit_code"] == 0
    assert json.loads(out.read_text())["phases"][0]["rounds_per_s"] == 1.0
    by = row["cpu_s_by_process"]
    assert by["benchmark"] >= 0.5
    assert by["other"] >= 0.5  # the child, sampled every 0.5 s while it ran
    assert row["cpu_s_ours_reaped"] >= 1.7  # the kernel's total of the reaped tree
    assert row["cpu_s_ours"] >= row["cpu_s_ours_reaped"]
    assert row["others_cores"] >= 0.0
    assert row["excluded"] == (row["others_cores"] > _protocol.OTHERS_LIMIT_CORES)


def test_paths_into_a_result() -> None:
    data = {"phases": [{"x": 1}, {"x": 2}]}
    assert _protocol.get_path(data, "phases.-1.x") == 2
    with pytest.raises(KeyError):
        _protocol.get_path(data, "phases.5.x")
