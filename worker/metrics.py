"""mnemoflow's own Prometheus metrics, and the one /metrics page a worker serves.

The Temporal SDK exports its metrics (`temporal_*`, counters ending in `_total`, durations in
seconds) from its Rust core on a loopback port of its own; `render` appends that page to ours
so that Prometheus scrapes one endpoint per pod. Our metrics live in a registry per
`MnemoflowMetrics` (not the global one), so tests and several workers in one process do not
collide. They are recorded by `mnemoflow.worker.interceptors`, never by activity code.
"""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from mnemoflow.models.contracts import ActivityName
from mnemoflow.models.round_store import SLICE_AND_TUNE, STORE_ROUND
from mnemoflow.models.usage import LLMUsage, PriceTable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_SIZE_BUCKETS = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
#: Activities whose output carries an `LLMUsage`, and the operation label they count under.
_LLM_OPERATIONS = {
    ActivityName.SLICE: "slice",
    ActivityName.TUNE: "tune",
    ActivityName.INDUCT: "induct",
}


class MnemoflowMetrics:
    """Counters and histograms of one worker process, in their own registry."""

    def __init__(self, prices: PriceTable | None = None) -> None:
        self.registry = CollectorRegistry()
        self.prices = prices or PriceTable()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        r = self.registry
        self.rounds = Counter(
            "mnemoflow_rounds", "Memory rounds that ended, by outcome.", ["outcome"], registry=r
        )
        self.fragments_indexed = Counter(
            "mnemoflow_fragments_indexed", "Fragments upserted into Milvus.", registry=r
        )
        self.injected_bytes = Histogram(
            "mnemoflow_injected_context_bytes",
            "Size of each published injected context (JSON bytes in Redis).",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.llm_tokens = Counter(
            "mnemoflow_llm_tokens",
            "LLM tokens by memory operation and kind (input, output, cache_hit, cache_miss).",
            ["operation", "kind"],
            registry=r,
        )
        self.llm_calls = Counter(
            "mnemoflow_llm_calls", "LLM calls by memory operation.", ["operation"], registry=r
        )
        self.llm_cost = Counter(
            "mnemoflow_llm_cost",
            "LLM cost at the configured price table, by operation and currency.",
            ["operation", "currency"],
            registry=r,
        )
        self.select_seconds = Histogram(
            "mnemoflow_select_seconds",
            "Latency of the select activity (Milvus search + scoring).",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.activity_seconds = Histogram(
            "mnemoflow_activity_seconds",
            "Latency of every mnemoflow activity attempt, by activity and outcome.",
            ["activity", "outcome"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        self.llm_refusals = Counter(
            "mnemoflow_llm_refusals",
            "Calls a model refused for good (HTTP 400/413/422, output never valid), by operation:"
            " a slice's turns were kept verbatim, a tune's theme got the default weights.",
            ["operation"],
            registry=r,
        )
        self.activity_failures = Counter(
            "mnemoflow_activity_failures",
            "Failed activity attempts by activity and error type (RateLimited is an LLM 429).",
            ["activity", "type"],
            registry=r,
        )

    def round_ended(self, outcome: str) -> None:
        """Count a round that completed, failed or was cancelled."""
        self.rounds.labels(outcome=outcome).inc()

    def activity_ended(self, activity: str, outcome: str, seconds: float) -> None:
        """Record one activity attempt's latency (and the select latency on its own)."""
        self.activity_seconds.labels(activity=activity, outcome=outcome).observe(seconds)
        if activity == ActivityName.SELECT and outcome == "completed":
            self.select_seconds.observe(seconds)

    def activity_failed(self, activity: str, error: BaseException) -> None:
        """Count a failed attempt by its error type (the ApplicationError type operators search)."""
        kind = getattr(error, "type", None) or type(error).__name__
        self.activity_failures.labels(activity=activity, type=kind).inc()

    def activity_result(self, activity: str, result: Any) -> None:
        """Count what a completed activity produced (by duck typing: results are pydantic)."""
        if activity == ActivityName.INDEX:
            self.fragments_indexed.inc(len(getattr(result, "ids", ())))
        elif activity == ActivityName.PUBLISH:
            size = getattr(result, "bytes", None)
            if isinstance(size, int):
                self.injected_bytes.observe(size)
        elif activity == STORE_ROUND:  # the lean round's index + select + publish step
            self.fragments_indexed.inc(len(getattr(result, "indexed", ())))
            size = getattr(result, "published_bytes", None)
            if isinstance(size, int) and size:
                self.injected_bytes.observe(size)
        elif activity == SLICE_AND_TUNE:  # the slice and its tunes in one step, counted as theirs
            self._refused("slice", getattr(result, "sliced", None))
            for tuned in getattr(result, "tuned", {}).values():
                self._refused("tune", tuned)
            sliced = getattr(getattr(result, "sliced", None), "usage", None)
            if isinstance(sliced, LLMUsage):
                self.llm_used("slice", sliced)
            for tuned in getattr(result, "tuned", {}).values():
                usage = getattr(tuned, "usage", None)
                if isinstance(usage, LLMUsage):
                    self.llm_used("tune", usage)
            return
        operation = _LLM_OPERATIONS.get(activity)
        if operation is not None:
            self._refused(operation, result)
        usage = getattr(result, "usage", None)
        if operation is not None and isinstance(usage, LLMUsage):
            self.llm_used(operation, usage)

    def _refused(self, operation: str, result: Any) -> None:
        if getattr(result, "refused", ""):
            self.llm_refusals.labels(operation=operation).inc()

    def llm_used(self, operation: str, usage: LLMUsage) -> None:
        """Add one LLM activity's usage and its price."""
        if usage.calls:
            self.llm_calls.labels(operation=operation).inc(usage.calls)
        kinds = {
            "input": usage.input_tokens,
            "output": usage.output_tokens,
            "cache_hit": usage.cache_hit_tokens,
            "cache_miss": usage.cache_miss_tokens,
        }
        for kind, tokens in kinds.items():
            if tokens:
                self.llm_tokens.labels(operation=operation, kind=kind).inc(tokens)
        cost = self.prices.cost(usage)
        if cost:
            self.llm_cost.labels(operation=operation, currency=self.prices.currency).inc(cost)


def sdk_runtime(port: int, host: str = "127.0.0.1") -> Runtime:
    """A Temporal runtime exporting SDK metrics in Prometheus naming (`_total`, seconds).

    Create it once per process and pass it to `mnemoflow.worker.client.connect`.
    """
    prometheus = PrometheusConfig(
        bind_address=f"{host}:{port}",
        counters_total_suffix=True,
        unit_suffix=True,
        durations_as_seconds=True,
    )
    return Runtime(telemetry=TelemetryConfig(metrics=prometheus))


def _fetch(url: str, timeout_s: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # loopback only
        body: bytes = response.read()
        return body


async def render(
    metrics: MnemoflowMetrics, sdk_url: str | None = None, timeout_s: float = 2.0
) -> bytes:
    """Our metrics followed by the SDK's page (its absence is logged in the page, not fatal)."""
    page = generate_latest(metrics.registry)
    if sdk_url is None:
        return page
    try:
        sdk = await asyncio.to_thread(_fetch, sdk_url, timeout_s)
    except OSError as err:
        return page + f"# temporal sdk metrics unavailable: {err}\n".encode()
    return page + sdk
