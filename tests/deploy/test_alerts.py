"""The chart's PrometheusRule: the alerts exist, parse, and ask for metrics the code exports."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import temporalio.bridge

from deploy import manifests
from mnemoflow.models.contracts import ActivityName
from mnemoflow.worker.metrics import MnemoflowMetrics

#: The concern each alert covers (issue: failed rounds, schedule-to-start latency, LLM 429s,
#: pending forgets, a worker not ready).
ALERTS = {
    "MnemoflowRoundsFailing",
    "MnemoflowWorkflowQueueBacklog",
    "MnemoflowLLMQueueBacklog",
    "MnemoflowLLMCallsFailing",
    "MnemoflowLLMRateLimited",
    "MnemoflowLLMRefusals",
    "MnemoflowForgetsPending",
    "MnemoflowWorkerNotReady",
}
_METRIC = re.compile(r"\b((?:mnemoflow|temporal|kube)_[a-z_]+)\{([^}]*)\}")


def _rules(env: str) -> list[dict[str, Any]]:
    docs = [d for d in manifests.render(env) if d["kind"] == "PrometheusRule"]
    return [r for d in docs for g in d["spec"]["groups"] for r in g["rules"]]


def _exported_mnemoflow_names() -> set[str]:
    names = set()
    for family in MnemoflowMetrics().registry.collect():
        if family.type == "counter":
            names.add(f"{family.name}_total")
        elif family.type == "histogram":
            names |= {f"{family.name}_{s}" for s in ("bucket", "count", "sum")}
    return names


def _sdk_core() -> bytes:
    # The Temporal SDK's metrics are named in its Rust core; its names are in the library.
    (library,) = Path(temporalio.bridge.__file__).parent.glob("temporal_sdk_bridge*")
    return library.read_bytes()


@pytest.mark.parametrize("env", ["default", "prod"])
def test_every_alert_is_there_and_parses(env: str) -> None:
    rules = _rules(env)
    assert {r["alert"] for r in rules} == ALERTS
    for doc in manifests.render(env):
        if doc["kind"] == "PrometheusRule":
            manifests.check_crd(doc)


def test_dev_has_no_operator_and_so_no_rule() -> None:
    assert not _rules("dev")


def test_a_broken_expression_is_caught() -> None:
    (doc,) = [d for d in manifests.render("prod") if d["kind"] == "PrometheusRule"]
    broken = copy.deepcopy(doc)
    broken["spec"]["groups"][0]["rules"][0]["expr"] = "sum(rate(mnemoflow_rounds_total[5m])"
    with pytest.raises(ValueError, match="MnemoflowRoundsFailing: expression does not parse"):
        manifests.check_crd(broken)


def test_alerts_ask_for_metrics_and_labels_the_code_exports() -> None:
    exported = _exported_mnemoflow_names()
    core = _sdk_core()
    activities = {v for k, v in vars(ActivityName).items() if k.isupper()}
    seen = set()
    for rule in _rules("prod"):
        for name, matchers in _METRIC.findall(rule["expr"]):
            seen.add(name)
            if name.startswith("mnemoflow_"):
                assert name in exported, f"{rule['alert']}: {name} is not exported"
            elif name.startswith("temporal_"):
                base = re.sub(r"_seconds_bucket$|_total$", "", name.removeprefix("temporal_"))
                assert base.encode() in core, f"{rule['alert']}: the SDK has no {base}"
            regex = re.search(r'activity=~"([^"]+)"', matchers)
            if regex:  # the label regex must select real activity names, and only those
                pattern = regex.group(1).replace("\\\\", "\\")
                selected = {a for a in activities if re.fullmatch(pattern, a)}
                assert selected, f"{rule['alert']}: {pattern} selects no activity"
            outcome = re.search(r'outcome="([^"]+)"', matchers)
            if outcome:
                assert outcome.group(1) in {"completed", "failed", "cancelled"}
    assert {
        "mnemoflow_rounds_total",
        "mnemoflow_activity_seconds_count",
        "temporal_activity_schedule_to_start_latency_seconds_bucket",
        "temporal_workflow_task_schedule_to_start_latency_seconds_bucket",
        "kube_deployment_status_replicas_unavailable",
    } <= seen


def test_llm_failure_alert_covers_exactly_the_llm_activities() -> None:
    (rule,) = [r for r in _rules("prod") if r["alert"] == "MnemoflowLLMCallsFailing"]
    pattern = re.search(r'activity=~"([^"]+)"', rule["expr"]).group(1).replace("\\\\", "\\")
    activities = {v for k, v in vars(ActivityName).items() if k.isupper()}
    assert {a for a in activities if re.fullmatch(pattern, a)} == {
        ActivityName.SLICE,
        ActivityName.TUNE,
        ActivityName.INDUCT,
    }
