"""Plots for docs/PERFORMANCE.md from benchmarks/results/*.json (run after the benchmarks).

python benchmarks/plots.py        (writes docs/img/bench_*.png; skips missing results)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT

IMG = ROOT / "docs" / "img"


def _load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _save(fig: Any, name: str) -> None:
    IMG.mkdir(parents=True, exist_ok=True)
    path = IMG / f"bench_{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"wrote {path.relative_to(ROOT)}")


def hot_path(plt: Any, data: dict[str, Any]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, (label, figures) in zip(axes, data["by_latency"].items(), strict=True):
        configs = [c for c in figures if c != "none"]
        x = range(len(configs))
        p50 = [max(figures[c]["added"]["p50_ms"], 0.1) for c in configs]
        p95 = [max(figures[c]["added"]["p95_ms"], 0.1) for c in configs]
        ax.bar([i - 0.2 for i in x], p50, width=0.4, label="p50")
        ax.bar([i + 0.2 for i in x], p95, width=0.4, label="p95")
        ax.axhline(10, color="red", linestyle="--", linewidth=1, label="target p95 10 ms")
        ax.set_yscale("log")
        ax.set_xticks(list(x), [c.replace("_", "\n") for c in configs], fontsize=8)
        ax.set_title(f"internal LLM latency {label}")
        ax.set_ylabel("added latency per turn (ms, log)")
    axes[0].legend(fontsize=8)
    _save(fig, "hot_path")


def throughput(plt: Any, data: dict[str, Any]) -> None:
    """Per round shape (side by side, one run) and the chart's split layout (its own run):
    CPU-ms per round by process, and history cost against each layout's targets."""
    phases = [(f"shape {p['shape']}\n{p['rounds_per_s']} rounds/s", p) for p in data["phases"]]
    split = _load("throughput_split")
    if split is not None:
        p = split["phases"][-1]
        phases.append((f"shape {p['shape']}, split\n{p['rounds_per_s']} rounds/s", p))
    names = [n for n, _ in phases]
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"wspace": 0.55})
    bottom = [0.0] * len(phases)
    procs = list(dict.fromkeys(k for _, p in phases for k in p["cpu_ms_per_round"]))
    for proc in procs:
        values = [p["cpu_ms_per_round"].get(proc, 0.0) for _, p in phases]
        axes[0].bar(names, values, bottom=bottom, label=proc)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    axes[0].axhline(60, color="red", linestyle="--", linewidth=1, label="target 60")
    floor = data.get("floor")
    if floor is not None:  # measured in the same run, no-op activities: the first bar's floor
        axes[0].hlines(
            floor["cpu_ms_per_round_all"],
            -0.4,
            0.4,
            colors="black",
            linestyles=":",
            linewidth=1.5,
            label=f"floor, same run ({floor['cpu_ms_per_round_all']})",
        )
    axes[0].set_ylabel("CPU-ms per round")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[0].set_title("CPU per round, each process apart", fontsize=10)
    x = list(range(len(phases)))
    events = [p["history_per_round"]["total"]["events"] for _, p in phases]
    tasks = [p["history_per_round"]["total"]["workflow_tasks"] for _, p in phases]
    axes[1].bar([i - 0.2 for i in x], events, width=0.4, label="history events")
    axes[1].bar([i + 0.2 for i in x], tasks, width=0.4, label="workflow tasks")
    axes[1].set_xticks(x, names)
    # Each layout's targets over its own bars: 20 events at dev defaults, 24 split; 4 tasks.
    for i, (name, _) in enumerate(phases):
        limit = 24 if "split" in name else 20
        axes[1].hlines(limit, i - 0.4, i, color="black", linestyle="--", linewidth=1, zorder=3)
        axes[1].hlines(4, i, i + 0.4, color="black", linestyle=":", linewidth=1, zorder=3)
    axes[1].legend(fontsize=7)
    axes[1].set_title(
        "per round (user workflow + round); targets: events --, tasks ..", fontsize=10
    )
    _save(fig, "throughput")


def retrieval(plt: Any, data: dict[str, Any]) -> None:
    sizes = list(data["by_store_size"])
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 3.6), sharey=True)
    axes = axes if len(sizes) > 1 else [axes]
    for ax, size in zip(axes, sizes, strict=True):
        every = data["by_store_size"][size].items()
        cases = {k: v for k, v in every if isinstance(v, dict) and "select_total" in v}
        labels = [k.replace("_per_user_retrieve_k_", "/user\nk=") for k in cases]
        p95 = [v["select_total"]["p95_ms"] for v in cases.values()]
        ax.bar(labels, p95, color=["tab:blue" if "all" in k else "tab:green" for k in cases])
        ax.axhline(50, color="red", linestyle="--", linewidth=1, label="target p95 50 ms")
        ax.set_yscale("log")
        ax.set_title(f"select p95, {int(size):,} fragments in the store", fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].set_ylabel("ms (log)")
    axes[0].legend(fontsize=8)
    _save(fig, "retrieval")


def recall(plt: Any, data: dict[str, Any]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    sides = ["mnemoflow", "ancestor"]
    means = [data[s]["mean"] for s in sides]
    x = range(len(sides))
    axes[0].bar(
        [i - 0.2 for i in x], [m["recall_same_thread"] for m in means], 0.4, label="same thread"
    )
    axes[0].bar(
        [i + 0.2 for i in x], [m["recall_new_thread"] for m in means], 0.4, label="new thread"
    )
    axes[0].set_xticks(list(x), sides)
    axes[0].set_ylim(0, 8)
    axes[0].set_ylabel("details recalled (of 8)")
    axes[0].legend(fontsize=8)
    axes[1].bar(
        [i - 0.2 for i in x],
        [m["memory_llm"]["input_tokens"] for m in means],
        0.4,
        label="memory LLM input tokens",
    )
    axes[1].bar(
        [i + 0.2 for i in x],
        [m["chat_model"]["input_tokens"] for m in means],
        0.4,
        label="chat model input tokens",
    )
    axes[1].set_xticks(list(x), sides)
    axes[1].legend(fontsize=8)
    axes[1].set_title("tokens per conversation (estimated, chars/3.3)", fontsize=10)
    _save(fig, "recall")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="accepted for `make bench`")
    parser.add_argument("--dry-run", action="store_true", help="parse arguments and exit")
    args = parser.parse_args()
    if args.dry_run:
        return 0
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, draw in (
        ("hot_path", hot_path),
        ("throughput", throughput),
        ("retrieval", retrieval),
        ("recall", recall),
    ):
        data = _load(name)
        if data is None:
            print(f"no results/{name}.json yet; skipped")
            continue
        draw(plt, data)
        plt.close("all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
