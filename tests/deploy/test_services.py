"""Temporal's chart with deploy/temporal-values.yaml (needs a copy of that chart: it is not
vendored; MNEMOFLOW_TEMPORAL_CHART names its charts/temporal directory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helm_python.errors import HelmError

from deploy import services

CHART = os.environ.get("MNEMOFLOW_TEMPORAL_CHART")
pytestmark = pytest.mark.skipif(
    not CHART, reason="MNEMOFLOW_TEMPORAL_CHART (Temporal's charts/temporal) is not set"
)


def test_bare_install_does_not_render_and_ours_does() -> None:
    chart = Path(str(CHART))
    with pytest.raises(HelmError, match="persistence"):
        services.render_temporal(chart, values={})
    docs = services.render_temporal(chart)
    assert {"Deployment", "Service", "Job"} <= {d["kind"] for d in docs}
    assert services.check_temporal(docs) == []


def test_a_frontend_the_mnemoflow_chart_cannot_reach_is_reported() -> None:
    docs = services.render_temporal(Path(str(CHART)))
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"].endswith("-frontend"):
            doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = "other"
    (problem,) = services.check_temporal(docs)
    assert "NetworkPolicy" in problem
