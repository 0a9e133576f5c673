"""Shared pieces of the benchmarks: the stack they start, fake models, figures, result files.

Every benchmark starts what it needs itself (an embedded stack on free ports in a temporary
data dir) and stops it; nothing here talks to a network beyond loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


# --- figures -------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / max / mean of durations given in seconds, in milliseconds."""
    ms = [s * 1000.0 for s in seconds]
    return {
        "n": len(ms),
        "p50_ms": round(pct(ms, 50), 2),
        "p95_ms": round(pct(ms, 95), 2),
        "max_ms": round(max(ms), 2) if ms else 0.0,
        "mean_ms": round(statistics.fmean(ms), 2) if ms else 0.0,
    }


# --- processes, read from /proc -------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces: the fields after it start past the last ')'.
    return raw[raw.rindex(")") + 2 :].split()


def _kids(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def process_cpu_s(pid: int, *, children: bool) -> float:
    """CPU seconds (user + system) of one process; with `children`, plus its live descendants.

    The benchmark process is the parent of the services it starts (Temporal, Milvus, Redis), so
    it is read with children=False and each service by its own pid; waited-for children's
    times (cutime) are never included.
    """
    fields = _stat(pid) if pid else None
    if fields is None:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
    if children:
        total += sum(process_cpu_s(k, children=True) for k in _kids(pid))
    return total


def process_nice(pid: int) -> int | None:
    """The nice level of a process (None when it is gone)."""
    fields = _stat(pid) if pid else None
    return int(fields[16]) if fields is not None else None


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores; idle and iowait excluded)."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in first[1:8])
    # guest time is already counted in user; steal is time this machine did not get.
    return (user + nice + system + irq + softirq) / _TICKS


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def meta(args: Any) -> dict[str, Any]:
    """Where a figure came from: commit, time, machine, load, arguments. `code_from`: the tree
    the package was imported from when it is not this checkout's (an A/B run's PYTHONPATH)."""
    import mnemoflow

    package = Path(mnemoflow.__file__).resolve().parent.parent
    return {
        "commit": _commit(),
        "code_from": None if package == ROOT.resolve() else str(package),
        "run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "nice": os.nice(0),
        "args": {k: v for k, v in vars(args).items()} if args is not None else {},
    }


def write_result(name: str, data: dict[str, Any], args: Any) -> Path:
    """benchmarks/results/<name>.json with a _meta stamp; returns the path.

    Under the protocol (benchmarks/_protocol.py) each repeat writes to the file
    MNEMOFLOW_BENCH_OUT names instead, and the protocol writes <name>.json from the repeats."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = os.environ.get("MNEMOFLOW_BENCH_OUT")
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.write_text(json.dumps({"_meta": meta(args), **data}, indent=2, ensure_ascii=False) + "\n")
    print(f"results written to {path}", flush=True)
    return path


# --- fake models ---------------------------------------------------------------------------


class SleepyChatModel(BaseChatModel):
    """An offline chat model that waits `latency_s` (a simulated LLM) and answers a fixed text.

    Used as the agent's main model (latency 0, to measure the middleware alone) and as the
    summarizer of SummarizationMiddleware.
    """

    latency_s: float = 0.0
    reply: str = "Noted, thank you."
    clock: Any = None
    calls: int = 0
    input_chars: int = 0

    @property
    def _llm_type(self) -> str:
        return "benchmark-sleepy"

    def bind_tools(self, tools: Any, **kwargs: Any) -> SleepyChatModel:  # type: ignore[override]
        return self

    def _result(self, messages: list[BaseMessage]) -> ChatResult:
        self.calls += 1
        chars = sum(len(m.text) for m in messages)
        self.input_chars += chars
        stamp = {"time": self.clock()} if self.clock is not None else {}
        message = AIMessage(
            content=self.reply,
            additional_kwargs=stamp,
            usage_metadata={
                "input_tokens": max(1, int(chars / 3.3)),
                "output_tokens": max(1, int(len(self.reply) / 3.3)),
                "total_tokens": max(1, int(chars / 3.3)) + max(1, int(len(self.reply) / 3.3)),
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.latency_s:
            time.sleep(self.latency_s)
        return self._result(messages)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        return self._result(messages)


# --- the embedded stack --------------------------------------------------------------------


def settings_from(env: dict[str, str]) -> Any:
    """The worker settings as `mnemoflow dev` reads them, with these environment variables set
    for the read only (the process's environment is left as it was)."""
    from mnemoflow.worker.settings import Settings

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Settings.load()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@asynccontextmanager
async def stack(
    *, latency_s: float = 0.0, embedding: str = "use", tag: str = "bench", models: str = "heuristic"
) -> AsyncIterator[tuple[Any, Any, Any]]:
    """The embedded stack (Temporal dev server, Redis, Milvus Lite, one worker in this process)
    on free ports in a temporary data dir, heuristic memory models with `latency_s` per call
    (`models="deepseek"`: DeepSeek, as DEEPSEEK_API_KEY and DEEPSEEK_BASE_URL say).

    Yields (StackInfo, Settings, Temporal client); everything is stopped on the way out.
    """
    from mnemoflow.devstack.embedded import DevPorts, embedded_stack
    from mnemoflow.devstack.processes import free_port

    with tempfile.TemporaryDirectory(prefix=f"mnemoflow-{tag}-") as tmp:
        env = {
            "MNEMOFLOW_DATA_DIR": tmp,
            "MNEMOFLOW_MODELS": models,
            "MNEMOFLOW_HEURISTIC_LATENCY_S": str(latency_s),
            "MILVUS_EMBEDDING": embedding,
        }
        settings = settings_from(env)
        ports: list[int] = []
        while len(ports) < 4:
            port = free_port()
            if port not in ports:
                ports.append(port)
        requested = DevPorts(temporal=ports[0], ui=ports[1], redis=ports[2], milvus=ports[3])
        async with embedded_stack(settings, requested) as up:
            assert up is not None
            yield up
