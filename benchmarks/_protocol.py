"""The one protocol every benchmark figure is measured by (docs/PERFORMANCE.md, "Protocol").

    python benchmarks/_protocol.py NAME [--short] [--repeats 3] [-- ARGS FOR THE BENCHMARK]

runs `benchmarks/NAME.py` `--repeats` times in this one invocation, each repeat a process of its
own that starts a fresh stack (every benchmark starts and stops what it needs), and writes
`benchmarks/results/NAME.json`: the benchmark's own figures as the median of the quiet repeats
(same keys as one run's file, so the docs and plots read either), and a `protocol` block:

- per repeat: wall time, load average at start and end, the machine's busy CPU seconds
  (/proc/stat), our CPU seconds (the repeat's process tree: exact from the kernel's accounting of
  reaped children, and per process from /proc samples, each process apart from its children, the
  Temporal dev server, Milvus Lite, Redis and worker processes named), nice levels, and the CPU
  taken by everything else on the machine meanwhile (`others_cores` = others' CPU-s / wall-s);
- a repeat where others took more than `OTHERS_LIMIT_CORES` (10 % of a core) is marked
  `excluded` and left out of the median; when every repeat is excluded the median is of all of
  them and `quiet` is false, so a figure from a busy machine says so;
- `spread` of the benchmark's headline figures: (max - min) / median over the repeats taken.

Nothing is retried or discarded silently: every repeat's headline figures stay in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import _TICKS, RESULTS, ROOT, _kids, _stat, machine_busy_s, meta

#: A repeat is excluded when other work took more than this share of one core on average.
OTHERS_LIMIT_CORES = 0.10
REPEATS = 3
SAMPLE_S = 0.5
#: The fixed workload `calibrate` times (integer arithmetic and dict stores, then a JSON dump).
CALIBRATION_N = 200_000
CALIBRATION_RUNS = 5
#: Before each repeat, the protocol waits (up to SETTLE_MAX_S, timing the workload every
#: SETTLE_STEP_S) until the machine runs the calibration workload within SETTLE_TOLERANCE of the
#: speed found before the first (FIRST_WINDOW_S). Measured here, the host slowed under minutes of
#: load (the workload 19.6 -> 28.9 CPU-ms over three repeats) and, timed every 20 s after, was
#: back at 18.7-19.7: so each repeat starts on the machine the first started on. A slowdown
#: during a repeat is not prevented; its calibration after the repeat shows it.
SETTLE_TOLERANCE = 0.10
SETTLE_MAX_S = 180.0
SETTLE_STEP_S = 10.0
#: The first repeat has no earlier speed to wait for, and `make bench` starts each benchmark
#: right after the one before, on a host that work may have slowed (measured: throughput_split's
#: first repeat started with the workload at 30.0 CPU-ms, which takes 19-20 on the idle host, and
#: its settling then waited for 30). So the protocol times the workload over this window first
#: and the fastest reading is the speed every repeat, the first included, waits for.
FIRST_WINDOW_S = 30.0

#: Per benchmark, the figures the protocol reports the spread of (paths into the result;
#: a list index may be negative). The median is taken of every number, these are summarised.
HEADLINES: dict[str, list[str]] = {
    "throughput": [
        "phases.-1.rounds_per_s",
        "phases.-1.cpu_ms_per_round_all",
        "phases.-1.history_per_round.total.events",
        "phases.-1.history_per_round.total.workflow_tasks",
        "phases.-1.accepted_to_published.p95_ms",
        "floor.cpu_ms_per_round_all",
        "floor.cpu_ms_per_round_above_floor",
    ],
    "throughput_split": [
        "phases.-1.rounds_per_s",
        "phases.-1.cpu_ms_per_round_all",
        "phases.-1.history_per_round.total.events",
        "phases.-1.history_per_round.total.workflow_tasks",
        "phases.-1.history_per_round.total.actions",
        "floor.cpu_ms_per_round_all",
        "floor.events_per_round",
        "floor.workflow_tasks_per_round",
    ],
    "round_floor": ["phases.0.rounds_per_s", "phases.0.cpu_ms_per_round.all"],
    "hot_path": [
        "by_latency.800ms.mnemoflow.added.p95_ms",
        "by_latency.800ms.mnemoflow_same_priority.added.p95_ms",
        "by_latency.0ms.mnemoflow.added.p95_ms",
    ],
    "retrieval": [
        "by_store_size.10000.1000_per_user_retrieve_k_256.select_total.p95_ms",
        "by_store_size.10000.store_step_reads.3000_per_user.bounded.p50_ms",
    ],
    "retrieval_scale": [
        "cases.0.milvus.agent_cpu_ms_per_call",
        "cases.-1.milvus.agent_cpu_ms_per_call",
        "cases.0.milvus.agent_cpu_ms_per_call_less_idle",
        "cases.-1.milvus.agent_cpu_ms_per_call_less_idle",
        "paired.ratio_agent_cpu_ms_per_call_p50",
        "paired.ratio_agent_cpu_ms_per_call_less_idle_p50",
        "cases.0.milvus.p95_ms",
    ],
    "milvus_flush": ["policies.every_64_rows.round_store_mean_ms"],
    "recall": ["mnemoflow.mean.recall_same_thread", "mnemoflow.mean.recall_new_thread"],
}


# --- paths into a result ---------------------------------------------------------------------


def get_path(data: Any, path: str) -> Any:
    """The value at a dotted path (`phases.-1.rounds_per_s`); KeyError when absent."""
    node = data
    for part in path.split("."):
        if isinstance(node, list):
            try:
                node = node[int(part)]
            except (ValueError, IndexError):
                raise KeyError(path) from None
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(path)
    return node


def median_of(runs: list[Any]) -> Any:
    """The element-wise median of results of the same shape: numbers by their median (rounded
    as finely as the inputs), dicts key by key, lists of equal length item by item; anything
    else (strings, mismatched shapes) from the first run."""
    first = runs[0]
    if all(isinstance(r, bool) for r in runs):
        return first
    if all(isinstance(r, int | float) and not isinstance(r, bool) for r in runs):
        mid = statistics.median(runs)
        if all(isinstance(r, int) for r in runs):
            return int(mid) if float(mid).is_integer() else mid
        digits = max(_decimals(r) for r in runs)
        return round(mid, digits)
    if all(isinstance(r, dict) for r in runs):
        return {
            k: median_of([r[k] for r in runs]) if all(k in r for r in runs) else v
            for k, v in first.items()
        }
    if all(isinstance(r, list) for r in runs) and len({len(r) for r in runs}) == 1:
        return [median_of(list(items)) for items in zip(*runs, strict=True)]
    return first


def _decimals(x: float | int) -> int:
    text = repr(float(x))
    return min(len(text.split(".")[1]), 4) if "." in text and "e" not in text else 4


def spread(values: list[float]) -> float:
    """(max - min) / median; 0.0 for fewer than two values or a zero median."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    return round((max(values) - min(values)) / mid, 3) if mid else 0.0


# --- processes ------------------------------------------------------------------------------


def _label(pid: int, root: int) -> str:
    """What a process of the tree is: the benchmark itself, a service, a worker (by role)."""
    if pid == root:
        return "benchmark"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "other"
    cmd = " ".join(a.decode(errors="replace") for a in argv)
    if "temporal" in Path(argv[0].decode(errors="replace")).name and "server" in cmd:
        return "temporal"
    if "milvus" in cmd:
        return "milvus"
    if "redis-server" in cmd or "redis" in Path(argv[0].decode(errors="replace")).name:
        return "redis"
    if "mnemoflow.ops.cli" in cmd and "worker" in cmd:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            env = []
        role = next(
            (e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"MNEMOFLOW_WORKER_ROLE=")),
            "all",
        )
        return f"worker_{role}"
    return "other"


class TreeSampler:
    """CPU seconds of every process under `root`, each apart from its children, sampled every
    SAMPLE_S from /proc (a process that ends between samples loses at most its last SAMPLE_S;
    the kernel's total of reaped children is recorded beside it)."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.seen: dict[int, tuple[str, float, int]] = {}  # pid -> (label, cpu_s, nice)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _walk(self) -> None:
        todo = [self.root]
        while todo:
            pid = todo.pop()
            fields = _stat(pid)
            if fields is None:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / _TICKS
            label = self.seen[pid][0] if pid in self.seen else _label(pid, self.root)
            self.seen[pid] = (label, cpu, int(fields[16]))
            todo += _kids(pid)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._walk()

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def by_label(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for label, cpu, _ in self.seen.values():
            out[label] = round(out.get(label, 0.0) + cpu, 2)
        return out

    def nice(self) -> dict[str, list[int]]:
        out: dict[str, set[int]] = {}
        for label, _, nice in self.seen.values():
            out.setdefault(label, set()).add(nice)
        return {k: sorted(v) for k, v in out.items()}


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def calibrate(runs: int = CALIBRATION_RUNS) -> float:
    """CPU milliseconds this thread takes for a fixed pure-Python workload, the least of `runs`
    (an interrupt or a preemption only adds). The same work costs more CPU time on a slower
    machine (a throttled host, caches shared with a neighbour), which no count of other
    processes shows: timed before and after every repeat, it says whether the machine itself
    changed speed between repeats or runs."""
    best = float("inf")
    for _ in range(runs):
        started = time.thread_time()
        total, table = 0, {}
        for i in range(CALIBRATION_N):
            total += i * i % 7
            table[i & 1023] = total
        json.dumps(table)
        best = min(best, time.thread_time() - started)
    return round(best * 1000, 1)


#: The memory-bound workload `calibrate_memory` times: a gather in random order over this many
#: 8-byte integers (64 MB, far past the caches).
MEMORY_CALIBRATION_N = 8_000_000


def calibrate_memory(runs: int = CALIBRATION_RUNS, n: int = MEMORY_CALIBRATION_N) -> float:
    """CPU milliseconds this thread takes to read `n` integers in a fixed random order, the least
    of `runs`. `calibrate`'s workload fits in a core's own caches; this one waits on memory, which
    neighbours sharing the host's caches and memory slow while the core runs at its usual speed
    (docs/PERFORMANCE.md, "The calibration workload does not see every slowdown": the no-op
    round floor cost a third more CPU one evening than one morning, `calibrate` reading the
    same). Recorded beside each repeat;
    the settling waits on `calibrate` only."""
    return round(gather_s(runs, n) * 1000, 1)


def gather_s(runs: int, n: int) -> float:
    """The least CPU seconds of `runs` gathers of `n` integers in a fixed random order."""
    import numpy as np

    values = np.arange(n, dtype=np.int64)
    order = np.random.default_rng(7).permutation(n)
    best = float("inf")
    for _ in range(runs):
        started = time.thread_time()
        int(values[order].sum())
        best = min(best, time.thread_time() - started)
    return best


def settle(
    baseline: float,
    *,
    tolerance: float = SETTLE_TOLERANCE,
    max_s: float = SETTLE_MAX_S,
    step_s: float = SETTLE_STEP_S,
    measure: Any = calibrate,
    sleep: Any = time.sleep,
    clock: Any = time.monotonic,
) -> tuple[float, float]:
    """Wait until the calibration workload runs within `tolerance` of `baseline` or `max_s`
    went by; returns the last calibration (CPU-ms) and the seconds waited. A machine that does
    not come back is not waited for forever: its repeat runs and its calibration says so."""
    started = clock()
    current = measure()
    while current > baseline * (1 + tolerance) and clock() - started + step_s <= max_s:
        sleep(step_s)
        current = measure()
    return current, round(clock() - started, 1)


def first_baseline(
    *,
    window_s: float = FIRST_WINDOW_S,
    step_s: float = SETTLE_STEP_S,
    measure: Any = calibrate,
    sleep: Any = time.sleep,
) -> list[float]:
    """The calibration readings over `window_s`, one every `step_s`: the fastest is the speed
    the repeats wait for (a host slowed by the work before recovers within tens of seconds)."""
    readings = [measure()]
    for _ in range(int(window_s // step_s)):
        sleep(step_s)
        readings.append(measure())
    return readings


def run_repeat(script: Path, argv: list[str], out: Path) -> dict[str, Any]:
    """One repeat: the benchmark as a process of its own; its figures and what the machine did."""
    env = {**os.environ, "MNEMOFLOW_BENCH_OUT": str(out)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    load0 = [round(x, 2) for x in os.getloadavg()]
    busy0, kids0, own0 = machine_busy_s(), _children_cpu_s(), _own_cpu_s()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(script), *argv], cwd=ROOT, env=env)
    with TreeSampler(proc.pid) as sampler:
        code = proc.wait()
    wall = time.perf_counter() - t0
    busy, kids = machine_busy_s() - busy0, _children_cpu_s() - kids0
    sampled = sampler.by_label()
    # This process's sampling is ours too, not other work's.
    sampled["protocol"] = round(_own_cpu_s() - own0, 2)
    # Reaped children are exact; a process left unreaped is only in the samples.
    ours = max(kids + sampled["protocol"], sum(sampled.values()))
    others = max(0.0, busy - ours)
    others_cores = others / wall if wall else 0.0
    return {
        "exit_code": code,
        "wall_s": round(wall, 2),
        "load_avg_1_5_15": {"start": load0, "end": [round(x, 2) for x in os.getloadavg()]},
        "cpu_s_machine": round(busy, 2),
        "cpu_s_ours": round(ours, 2),
        "cpu_s_ours_reaped": round(kids, 2),
        "cpu_s_by_process": sampled,
        "nice_by_process": sampler.nice(),
        "cpu_s_others": round(others, 2),
        "others_cores": round(others_cores, 3),
        "excluded": others_cores > OTHERS_LIMIT_CORES,
    }


def protocol(name: str, argv: list[str], repeats: int = REPEATS) -> dict[str, Any]:
    """Run NAME `repeats` times; the merged result (not yet written)."""
    script = ROOT / "benchmarks" / f"{name.removesuffix('_split')}.py"
    if not script.exists():
        raise SystemExit(f"no benchmark {script.relative_to(ROOT)}")
    rows: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix=f"mnemoflow-protocol-{name}-") as tmp:
        for n in range(1, repeats + 1):
            print(f"== {name}: repeat {n} of {repeats}", flush=True)
            out = Path(tmp) / f"{n}.json"
            if n == 1:
                first = first_baseline()
                baseline = min(first)
            before, waited = settle(baseline)
            if n == 1:
                waited += FIRST_WINDOW_S
            memory_before = calibrate_memory()
            row = run_repeat(script, argv, out)
            row["calibration_cpu_ms"] = {"before": before, "after": calibrate()}
            row["calibration_memory_cpu_ms"] = {
                "before": memory_before,
                "after": calibrate_memory(),
            }
            row["settle_s"] = waited
            if n == 1:
                row["calibration_first_window_cpu_ms"] = first
            if row["exit_code"] != 0 or not out.exists():
                raise SystemExit(f"{name}: repeat {n} failed (exit {row['exit_code']})")
            result = json.loads(out.read_text())
            result.pop("_meta", None)
            row["figures"] = {p: _maybe(result, p) for p in HEADLINES.get(name, [])}
            print(
                f"   {row['wall_s']} s after {waited} s settling; calibration {before} / "
                f"{row['calibration_cpu_ms']['after']} CPU-ms before / after;"
                f" others took {row['others_cores']:.0%} of a core"
                f"{' (excluded)' if row['excluded'] else ''}; {row['figures']}",
                flush=True,
            )
            rows.append(row)
            results.append(result)
    return merge(name, rows, results)


def merge(name: str, rows: list[dict[str, Any]], results: list[dict[str, Any]]) -> dict[str, Any]:
    """The repeats' results as one: the median of those not excluded (of all, marked `quiet`
    false, when every repeat was), with the protocol block."""
    taken = [i for i, r in enumerate(rows) if not r["excluded"]]
    quiet = bool(taken)
    if not quiet:
        taken = list(range(len(rows)))
    merged = median_of([results[i] for i in taken])
    spreads = {
        p: spread([v for i in taken if isinstance(v := rows[i]["figures"].get(p), int | float)])
        for p in HEADLINES.get(name, [])
    }
    calibrated = [r.get("calibration_cpu_ms") for r in rows]
    memory = [[m["before"], m["after"]] for r in rows if (m := r.get("calibration_memory_cpu_ms"))]
    merged["protocol"] = {
        "repeats": rows,
        "repeats_in_median": [i + 1 for i in taken],
        "quiet": quiet,
        "others_limit_cores": OTHERS_LIMIT_CORES,
        "spread": spreads,
        # CPU per round of the same code between any two repeats (target: within 20 %)
        # The fixed workload's CPU-ms before the first repeat and after each (calibrate)
        "calibration_cpu_ms": [calibrated[0]["before"]] + [c["after"] for c in calibrated]
        if calibrated and all(calibrated)
        else None,
        # Per repeat, the calibration before it (after settling) and after it
        "calibration_by_repeat_cpu_ms": [[c["before"], c["after"]] for c in calibrated]
        if calibrated and all(calibrated)
        else None,
        # The memory-bound workload's CPU-ms before and after each repeat (calibrate_memory)
        "calibration_memory_by_repeat_cpu_ms": memory
        if memory and len(memory) == len(rows)
        else None,
        "settle_tolerance": SETTLE_TOLERANCE,
        "cpu_spread_all_repeats": spread(
            [
                v
                for r in rows
                if isinstance(v := r["figures"].get("phases.-1.cpu_ms_per_round_all"), int | float)
            ]
        ),
    }
    return merged


def _maybe(data: Any, path: str) -> Any:
    try:
        return get_path(data, path)
    except KeyError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="benchmark: throughput, throughput_split, hot_path, ...")
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--short", action="store_true", help="the benchmark's short sizes")
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    bench_argv = (["--short"] if args.short else []) + rest
    if args.name == "throughput_split":
        bench_argv += ["--layout", "split"]
    merged = protocol(args.name, bench_argv, args.repeats)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    stamp = meta(argparse.Namespace(benchmark_args=bench_argv, repeats=args.repeats))
    path.write_text(json.dumps({"_meta": stamp, **merged}, indent=2, ensure_ascii=False) + "\n")
    p = merged["protocol"]
    print(
        f"{args.name}: median of repeats {p['repeats_in_median']}"
        f"{'' if p['quiet'] else ' (no quiet repeat: median of all, marked)'}; "
        f"spread {p['spread']}; written to {path.relative_to(ROOT)}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
