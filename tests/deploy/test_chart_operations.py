"""What the rendered chart does in operation: drains, network, scaling, Cloud auth, versions.

Every test renders the chart with the real Helm engine (values checked by values.schema.json,
as `helm install` does) and reads the manifests; overrides play the part of `--set`.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from helm_python.errors import HelmError

from deploy import manifests
from mnemoflow.workflows.options import STORE_START_TO_CLOSE

ENVS = list(manifests.ENVIRONMENTS)
DIGEST = "sha256:" + "ab" * 32


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """Manifests of one kind by component (or name when they have none)."""
    out = {}
    for d in docs:
        if d["kind"] == kind:
            labels = d["metadata"].get("labels") or {}
            out[labels.get("app.kubernetes.io/component", d["metadata"]["name"])] = d
    return out


def _env(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}


def _values(env: str) -> dict[str, Any]:
    from helm_python import Chart

    with Chart.load(manifests.CHART) as chart:
        return chart.merge_values(manifests.values(env))


# --- drains -------------------------------------------------------------------------------


@pytest.mark.parametrize("env", ENVS)
def test_grace_periods_derive_from_the_timeouts_per_role(env: str) -> None:
    values = _values(env)
    drain = values["shutdown"]["drainMarginSeconds"]
    exit_margin = values["shutdown"]["exitMarginSeconds"]
    # The chart's store bound is the round's store activity timeout, not a guess.
    assert values["stores"]["timeoutSeconds"] >= STORE_START_TO_CLOSE.total_seconds()
    bounds = {
        "llm": values["llm"]["timeoutSeconds"],
        "workflow": values["stores"]["timeoutSeconds"],
    }
    for role, deployment in _kind(manifests.render(env), "Deployment").items():
        env_vars = _env(deployment)
        graceful = float(env_vars["MNEMOFLOW_GRACEFUL_SHUTDOWN_S"])
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert graceful == bounds[role] + drain
        assert grace == graceful + exit_margin > graceful
        if role == "llm":  # the LLM call in flight outlives no drain
            assert float(env_vars["DEEPSEEK_TIMEOUT_S"]) < graceful
        else:
            assert "DEEPSEEK_TIMEOUT_S" not in env_vars


def test_a_longer_llm_timeout_lengthens_only_the_llm_drain() -> None:
    before = _kind(manifests.render("prod"), "Deployment")
    after = _kind(
        manifests.render("prod", overrides={"llm": {"timeoutSeconds": 180}}), "Deployment"
    )
    grace = {
        role: (d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], _env(d))
        for role, d in after.items()
    }
    assert grace["llm"][1]["DEEPSEEK_TIMEOUT_S"] == "180"
    assert grace["llm"][1]["MNEMOFLOW_GRACEFUL_SHUTDOWN_S"] == "185"
    assert grace["llm"][0] == 200
    assert (
        grace["workflow"][0]
        == before["workflow"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    )


def test_the_configmap_leaves_the_derived_variables_to_each_role() -> None:
    (config,) = _kind(manifests.render("prod"), "ConfigMap").values()
    assert not {"MNEMOFLOW_GRACEFUL_SHUTDOWN_S", "DEEPSEEK_TIMEOUT_S"} & set(config["data"])


@pytest.mark.parametrize("env", ["default", "prod"])
def test_disruption_budgets_let_unhealthy_pods_be_evicted(env: str) -> None:
    pdbs = _kind(manifests.render(env), "PodDisruptionBudget")
    assert set(pdbs) == {"workflow", "llm"}
    for pdb in pdbs.values():
        assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


# --- network ------------------------------------------------------------------------------


def _egress(policy: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Egress peers by port; every rule must name its destinations."""
    out: dict[int, list[dict[str, Any]]] = {}
    for rule in policy["spec"]["egress"]:
        assert rule.get("to"), f"egress rule open to any address: {rule}"
        for port in {p["port"] for p in rule["ports"]}:
            out.setdefault(port, []).extend(rule["to"])
    return out


@pytest.mark.parametrize("env", ENVS)
def test_egress_names_its_destinations_and_only_llm_pods_reach_443(env: str) -> None:
    policies = _kind(manifests.render(env), "NetworkPolicy")
    assert set(policies) == {"workflow", "llm"}
    for role, policy in policies.items():
        selector = policy["spec"]["podSelector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == role
        egress = _egress(policy)
        assert set(egress) == ({53, 7233, 19530, 6379} | ({443} if role == "llm" else set()))
        (dns,) = egress[53]
        assert dns["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
        protocols = {
            p["protocol"] for r in policy["spec"]["egress"] for p in r["ports"] if p["port"] == 53
        }
        assert protocols == {"UDP", "TCP"}
        for port, store in ((7233, "temporal"), (19530, "milvus"), (6379, "redis")):
            (peer,) = egress[port]
            ns = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            assert ns == store and peer["podSelector"]["matchLabels"]
        if role == "llm":
            (public,) = egress[443]
            assert public["ipBlock"]["cidr"] == "0.0.0.0/0"
            assert "10.0.0.0/8" in public["ipBlock"]["except"]


def test_external_endpoints_are_ip_blocks() -> None:
    cloud = {
        "networkPolicy": {
            "egress": {
                "temporal": {
                    "namespaceSelector": None,
                    "podSelector": None,
                    "cidrs": ["203.0.113.0/24", "198.51.100.7/32"],
                }
            }
        }
    }
    for policy in _kind(manifests.render("prod", overrides=cloud), "NetworkPolicy").values():
        manifests.validate(policy)
        peers = _egress(policy)[7233]
        assert peers == [
            {"ipBlock": {"cidr": "203.0.113.0/24"}},
            {"ipBlock": {"cidr": "198.51.100.7/32"}},
        ]


def test_a_destination_without_selectors_or_cidrs_fails_to_render() -> None:
    nowhere = {
        "networkPolicy": {"egress": {"redis": {"namespaceSelector": None, "podSelector": None}}}
    }
    with pytest.raises(HelmError, match=r"networkPolicy\.egress\.redis"):
        manifests.render("default", overrides=nowhere)


# --- scaling ------------------------------------------------------------------------------


@pytest.mark.parametrize("env", ["default", "prod"])
def test_llm_replicas_are_capped_at_what_the_rate_limit_keeps_busy(env: str) -> None:
    llm = _values(env)["workers"]["llm"]
    scaled = _kind(manifests.render(env), "ScaledObject")
    busy = math.ceil(
        llm["activitiesPerSecond"]
        * llm["autoscaling"]["activitySeconds"]
        / llm["maxConcurrentActivities"]
    )
    cap = scaled["llm"]["spec"]["maxReplicaCount"]
    assert cap == max(
        min(llm["autoscaling"]["maxReplicas"], busy), llm["autoscaling"]["minReplicas"]
    )
    if env == "prod":  # the values ask for 12; the limit keeps 10 busy
        assert cap == 10 < llm["autoscaling"]["maxReplicas"]
    workflow = _values(env)["workers"]["workflow"]["autoscaling"]["maxReplicas"]
    assert scaled["workflow"]["spec"]["maxReplicaCount"] == workflow


def test_llm_cap_follows_the_limit_and_lifts_without_one() -> None:
    slow = manifests.render("prod", overrides={"workers": {"llm": {"activitiesPerSecond": 1}}})
    assert _kind(slow, "ScaledObject")["llm"]["spec"]["maxReplicaCount"] == 2  # = minReplicas
    unlimited = manifests.render(
        "prod", overrides={"workers": {"llm": {"activitiesPerSecond": None}}}
    )
    llm = _kind(unlimited, "ScaledObject")["llm"]
    assert llm["spec"]["maxReplicaCount"] == 12
    assert "MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND" not in _env(_kind(unlimited, "Deployment")["llm"])


# --- Temporal Cloud -----------------------------------------------------------------------


def test_keda_authenticates_to_temporal_cloud_from_secret_keys() -> None:
    cloud = {
        "config": {"TEMPORAL_ADDRESS": "mf.a1b2c.tmprl.cloud:7233"},
        "keda": {"auth": {"enabled": True, "caKey": "ca.pem", "tlsServerName": "mf.a1b2c"}},
    }
    docs = manifests.render("prod", overrides=cloud)
    (auth,) = _kind(docs, "TriggerAuthentication").values()
    manifests.validate(auth)
    refs = {r["parameter"]: (r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]}
    assert refs == {
        "apiKey": ("mnemoflow-secrets", "TEMPORAL_API_KEY"),
        "ca": ("mnemoflow-secrets", "ca.pem"),
    }
    for scaled in _kind(docs, "ScaledObject").values():
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
        assert trigger["metadata"]["endpoint"] == "mf.a1b2c.tmprl.cloud:7233"
        assert trigger["metadata"]["tlsServerName"] == "mf.a1b2c"


def test_mtls_needs_both_halves_and_no_auth_means_no_trigger_authentication() -> None:
    half = {"keda": {"auth": {"enabled": True, "apiKeyKey": "", "certKey": "tls.crt"}}}
    with pytest.raises(HelmError, match=r"certKey and keda\.auth\.keyKey"):
        manifests.render("prod", overrides=half)
    docs = manifests.render("prod")
    assert not _kind(docs, "TriggerAuthentication")
    assert all(
        "authenticationRef" not in s["spec"]["triggers"][0]
        for s in _kind(docs, "ScaledObject").values()
    )


# --- image and versions -------------------------------------------------------------------


def test_image_digest_wins_over_the_tag() -> None:
    for deployment in _kind(manifests.render("prod"), "Deployment").values():
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == (
            "ghcr.io/mnemoflow/mnemoflow:0.1.0"
        )
    pinned = manifests.render("prod", overrides={"image": {"digest": DIGEST}})
    for deployment in _kind(pinned, "Deployment").values():
        image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        assert image == f"ghcr.io/mnemoflow/mnemoflow@{DIGEST}"


def test_worker_versioning_names_the_deployment_and_the_build() -> None:
    for deployment in _kind(manifests.render("default"), "Deployment").values():
        assert not {"MNEMOFLOW_DEPLOYMENT_NAME", "MNEMOFLOW_BUILD_ID"} & set(_env(deployment))
    prod = _kind(manifests.render("prod", overrides={"image": {"tag": "0.2.0"}}), "Deployment")
    for deployment in prod.values():
        env = _env(deployment)
        assert (env["MNEMOFLOW_DEPLOYMENT_NAME"], env["MNEMOFLOW_BUILD_ID"]) == (
            "mnemoflow",
            "0.2.0",
        )
    own = manifests.render(
        "default", release="blue", overrides={"versioning": {"enabled": True, "buildId": "b7"}}
    )
    for deployment in _kind(own, "Deployment").values():
        env = _env(deployment)
        assert (env["MNEMOFLOW_DEPLOYMENT_NAME"], env["MNEMOFLOW_BUILD_ID"]) == (
            "blue-mnemoflow",
            "b7",
        )


# --- values schema ------------------------------------------------------------------------

BAD_VALUES = [
    ({"image": {"digest": "sha256:1234"}}, "/image/digest"),
    ({"image": {"tag": "has space"}}, "/image/tag"),
    ({"workers": {"llm": {"maxConcurrentActivities": 0}}}, "maxConcurrentActivities"),
    ({"workers": {"llm": {"activitiesPerSecond": "fast"}}}, "activitiesPerSecond"),
    ({"workers": {"llm": {"role": "workflow"}}}, "/workers/llm/role"),
    ({"workers": {"extra": {"role": "llm"}}}, "extra"),
    ({"config": {"MNEMOFLOW_GRACEFUL_SHUTDOWN_S": "5"}}, "MNEMOFLOW_GRACEFUL_SHUTDOWN_S"),
    ({"config": {"TEMPORAL_ADDRESS": "http://temporal"}}, "TEMPORAL_ADDRESS"),
    ({"llm": {"timeoutSeconds": -1}}, "/llm/timeoutSeconds"),
    ({"workers": {"llm": {"autoscaling": {"activitySeconds": None}}}}, "activitySeconds"),
    ({"networkPolicy": {"egress": {"temporal": {"cidrs": ["not-a-cidr"]}}}}, "cidrs"),
    ({"podSecurityContext": {"runAsNonRoot": False}}, "runAsNonRoot"),
    ({"replicas": 3}, "replicas"),
]


@pytest.mark.parametrize(("bad", "where"), BAD_VALUES, ids=[w for _, w in BAD_VALUES])
def test_bad_values_fail_to_render(bad: dict[str, Any], where: str) -> None:
    with pytest.raises(HelmError, match=where):
        manifests.render("default", overrides=bad)
