"""mnemoflow's metrics from activity results, and the merged /metrics page."""

from __future__ import annotations

from prometheus_client import generate_latest

from mnemoflow.models.contracts import (
    ActivityName,
    IndexOutput,
    PublishOutput,
    SliceOutput,
    TuneOutput,
)
from mnemoflow.models.params import TunedParams
from mnemoflow.models.round_store import (
    SLICE_AND_TUNE,
    STORE_ROUND,
    SliceTuneOutput,
    StoreRoundOutput,
)
from mnemoflow.models.usage import LLMUsage, PriceTable
from mnemoflow.worker.health import HttpEndpoint
from mnemoflow.worker.metrics import MnemoflowMetrics, render


def _value(metrics: MnemoflowMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_results_become_counters_and_histograms() -> None:
    m = MnemoflowMetrics(PriceTable())
    m.activity_result(ActivityName.INDEX, IndexOutput(ids=["a", "b", "c"]))
    m.activity_result(ActivityName.PUBLISH, PublishOutput(key="k", bytes=1500))
    usage = LLMUsage(calls=1, input_tokens=1000, output_tokens=200)
    m.activity_result(ActivityName.SLICE, SliceOutput(drafts=[], usage=usage))
    m.activity_ended(ActivityName.SELECT, "completed", 0.02)
    m.activity_ended(ActivityName.SLICE, "failed", 1.5)
    m.round_ended("completed")
    m.round_ended("failed")

    assert _value(m, "mnemoflow_fragments_indexed_total") == 3
    assert _value(m, "mnemoflow_injected_context_bytes_sum") == 1500
    assert _value(m, "mnemoflow_llm_tokens_total", operation="slice", kind="input") == 1000
    assert _value(m, "mnemoflow_llm_tokens_total", operation="slice", kind="output") == 200
    # DeepSeek default prices: 1000 input (cache miss) at 1/M + 200 output at 2/M.
    cost = _value(m, "mnemoflow_llm_cost_total", operation="slice", currency="CNY")
    assert cost is not None and abs(cost - 0.0014) < 1e-12
    assert _value(m, "mnemoflow_select_seconds_count") == 1
    assert (
        _value(m, "mnemoflow_activity_seconds_count", activity="mnemoflow.slice", outcome="failed")
        == 1
    )
    assert _value(m, "mnemoflow_rounds_total", outcome="completed") == 1
    assert _value(m, "mnemoflow_rounds_total", outcome="failed") == 1


def test_the_lean_rounds_local_steps_are_counted_like_the_activities_they_replace() -> None:
    """Shape 3 slices and tunes in one local step and stores in another: their fragments,
    published bytes and LLM usage count as index, publish, slice and tune would."""
    m = MnemoflowMetrics(PriceTable())
    m.activity_result(
        STORE_ROUND, StoreRoundOutput(indexed=["a", "b"], published_bytes=900, candidates=4)
    )
    sliced = SliceOutput(drafts=[], usage=LLMUsage(calls=1, input_tokens=700, output_tokens=90))
    tuned = TuneOutput(
        params=TunedParams(), usage=LLMUsage(calls=1, input_tokens=300, output_tokens=20)
    )
    m.activity_result(SLICE_AND_TUNE, SliceTuneOutput(sliced=sliced, tuned={"orders": tuned}))

    assert _value(m, "mnemoflow_fragments_indexed_total") == 2
    assert _value(m, "mnemoflow_injected_context_bytes_sum") == 900
    assert _value(m, "mnemoflow_llm_tokens_total", operation="slice", kind="input") == 700
    assert _value(m, "mnemoflow_llm_tokens_total", operation="tune", kind="input") == 300
    assert _value(m, "mnemoflow_llm_calls_total", operation="slice") == 1
    assert _value(m, "mnemoflow_llm_calls_total", operation="tune") == 1


def test_registries_are_per_instance() -> None:
    a, b = MnemoflowMetrics(), MnemoflowMetrics()
    a.round_ended("completed")
    assert _value(b, "mnemoflow_rounds_total", outcome="completed") is None


async def test_render_appends_the_sdk_page_and_survives_its_absence() -> None:
    m = MnemoflowMetrics()
    sdk_page = b"# TYPE temporal_request_total counter\ntemporal_request_total 7\n"

    async def sdk() -> tuple[int, str, bytes]:
        return 200, "text/plain", sdk_page

    async with HttpEndpoint("127.0.0.1", 0, {"/metrics": sdk}) as fake_sdk:
        page = await render(m, f"http://127.0.0.1:{fake_sdk.port}/metrics")
    assert page.startswith(generate_latest(m.registry)[:20])
    assert page.endswith(sdk_page)
    assert b"process_cpu_seconds_total" in page or b"python_info" in page

    gone = await render(m, f"http://127.0.0.1:{fake_sdk.port}/metrics", timeout_s=1)
    assert b"# temporal sdk metrics unavailable" in gone
