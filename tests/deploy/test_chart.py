"""The Helm chart, rendered offline by the real Helm engine, validated strictly per environment."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from deploy import manifests
from mnemoflow.worker.settings import SECTIONS

ENVS = list(manifests.ENVIRONMENTS)


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _env_names() -> set[str]:
    names = set()
    for _, cls in SECTIONS:
        prefix = cls.model_config.get("env_prefix", "")
        names |= {f"{prefix}{field}".upper() for field in cls.model_fields}
    return names


@pytest.fixture(scope="module", params=ENVS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, manifests.render(request.param)


def test_every_manifest_validates_strictly(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    env, docs = rendered
    assert docs
    for doc in docs:
        manifests.validate(doc)
    lint = manifests.lint(env)
    assert not [m for m in lint.get("messages") or [] if m["severity"] > 1], lint


def test_strict_validation_rejects_unknown_fields() -> None:
    deployment = copy.deepcopy(_by_kind(manifests.render("default"), "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(Exception, match="livenesProbe"):
        manifests.validate(deployment)


def test_two_workers_on_their_own_queues(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = rendered
    deployments = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in _by_kind(docs, "Deployment")
    }
    assert set(deployments) == {"workflow", "llm"}
    envs = {}
    for role, deployment in deployments.items():
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        envs[role] = {e["name"]: e["value"] for e in container["env"]}
        assert envs[role]["MNEMOFLOW_WORKER_ROLE"] == role
    assert envs["workflow"]["TEMPORAL_TASK_QUEUE"] != envs["workflow"]["TEMPORAL_LLM_TASK_QUEUE"]
    assert "MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND" in envs["llm"]
    assert "MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND" not in envs["workflow"]


def test_every_manifest_validates_for_each_supported_kubernetes(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    assert manifests.KUBE_VERSIONS == ("1.29.0", "1.30.0", "1.31.0", "1.32.0")
    for kube in manifests.KUBE_VERSIONS[1:]:
        for doc in docs:
            assert manifests.validate(doc, kube)


def test_pods_are_locked_down_and_probed(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    for deployment in _by_kind(docs, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["resources"]["requests"] and container["resources"]["limits"]
        sources = {next(iter(s)) for s in container["envFrom"]}
        assert sources == {"configMapRef", "secretRef"}


def test_config_secret_and_env_keys_are_real_settings(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    _, docs = rendered
    known = _env_names()
    (config,) = _by_kind(docs, "ConfigMap")
    assert set(config["data"]) <= known, set(config["data"]) - known
    for secret in _by_kind(docs, "Secret"):
        assert set(secret.get("stringData", {})) <= known
    for deployment in _by_kind(docs, "Deployment"):
        env = {e["name"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env <= known, env - known


def test_scaling_scraping_and_disruption(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    env, docs = rendered
    deployments = {d["metadata"]["name"] for d in _by_kind(docs, "Deployment")}
    assert _by_kind(docs, "NetworkPolicy")
    scaled = _by_kind(docs, "ScaledObject")
    if env == "dev":  # no KEDA, no operator: fixed replicas and scrape annotations
        assert not scaled and not _by_kind(docs, "ServiceMonitor")
        for d in _by_kind(docs, "Deployment"):
            assert d["spec"]["replicas"] == 1
            assert (
                d["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
            )
        return
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled} == deployments
    queues = {s["spec"]["triggers"][0]["metadata"]["taskQueue"] for s in scaled}
    assert len(queues) == 2
    assert {
        p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        for p in _by_kind(docs, "PodDisruptionBudget")
    } == {"workflow", "llm"}
    assert _by_kind(docs, "ServiceMonitor")
    if env == "prod":
        assert not _by_kind(docs, "Secret"), "prod takes an existing Secret"
