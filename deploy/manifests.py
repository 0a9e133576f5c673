"""Render the Helm chart offline and validate every manifest (`make deploy-check`).

Rendering uses the real Helm engine (the `helm-python-sdk` wheel embeds it; no helm binary, no
cluster, no network), which checks the values against `values.schema.json` exactly as `helm
install` does. Built-in kinds are validated with `kubernetes-validate` in strict mode (unknown
fields are errors) against the schemas it ships for every Kubernetes version in
`KUBE_VERSIONS`; the CRDs (KEDA ScaledObject and TriggerAuthentication, Prometheus Operator
ServiceMonitor and PrometheusRule) have no schema available offline here and are checked
structurally by `check_crd` (alert expressions by a real PromQL parser).

    python -m deploy.manifests            # validate default, dev and prod
    python -m deploy.manifests dev --print  # the rendered manifests of one environment
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent
CHART = DEPLOY / "chart" / "mnemoflow"
ENVIRONMENTS = {
    "default": None,
    "dev": DEPLOY / "values-dev.yaml",
    "prod": DEPLOY / "values-prod.yaml",
}
#: Every Kubernetes version the manifests must be valid for (kubernetes-validate ships them).
KUBE_VERSIONS = ("1.29.0", "1.30.0", "1.31.0", "1.32.0")
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
#: Parameters KEDA's temporal scaler takes from a TriggerAuthentication.
TEMPORAL_AUTH_PARAMETERS = {"apiKey", "cert", "key", "ca", "keyPassword"}


def values(environment: str) -> dict[str, Any]:
    """The values file of an environment ({} for the chart defaults)."""
    path = ENVIRONMENTS[environment]
    return {} if path is None else yaml.safe_load(path.read_text())


def render(
    environment: str,
    release: str = "mf",
    namespace: str = "mnemoflow",
    overrides: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Every manifest of the chart for an environment (plus `overrides`, like `--set`)."""
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        given = _deep_merge(values(environment), overrides or {})
        files = chart.render(given, name=release, namespace=namespace, is_install=True)
    docs: list[dict[str, Any]] = []
    for name in sorted(files):
        if not name.endswith((".yaml", ".yml")):
            continue
        docs += [d for d in yaml.safe_load_all(files[name]) if d]
    return docs


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def lint(environment: str, kube_version: str = KUBE_VERSIONS[0]) -> dict[str, Any]:
    """`helm lint --strict` of the chart with an environment's values."""
    from helm_python.chart import lint as helm_lint

    return helm_lint(CHART, values(environment), strict=True, kube_version=kube_version)


def check_crd(doc: dict[str, Any]) -> None:
    """Structural checks of a ScaledObject or ServiceMonitor (raises ValueError)."""
    spec = doc.get("spec") or {}
    if doc["kind"] == "ScaledObject":
        target = spec.get("scaleTargetRef") or {}
        if not target.get("name"):
            raise ValueError("ScaledObject without scaleTargetRef.name")
        if not 0 <= int(spec["minReplicaCount"]) <= int(spec["maxReplicaCount"]):
            raise ValueError("ScaledObject replica bounds out of order")
        for trigger in spec.get("triggers") or []:
            meta = trigger.get("metadata") or {}
            if trigger.get("type") != "temporal":
                raise ValueError(f"unexpected trigger {trigger.get('type')}")
            missing = {"endpoint", "namespace", "taskQueue", "targetQueueSize"} - set(meta)
            if missing:
                raise ValueError(f"temporal trigger without {sorted(missing)}")
            if any(not isinstance(v, str) for v in meta.values()):
                raise ValueError("KEDA trigger metadata values must all be strings")
        if not spec.get("triggers"):
            raise ValueError("ScaledObject without triggers")
    elif doc["kind"] == "TriggerAuthentication":
        refs = spec.get("secretTargetRef") or []
        if not refs:
            raise ValueError("TriggerAuthentication without secretTargetRef")
        for ref in refs:
            if ref.get("parameter") not in TEMPORAL_AUTH_PARAMETERS:
                raise ValueError(f"temporal scaler has no auth parameter {ref.get('parameter')}")
            if not (ref.get("name") and ref.get("key")):
                raise ValueError("secretTargetRef needs a Secret name and key")
    elif doc["kind"] == "PrometheusRule":
        check_rules(spec)
    else:
        if not (spec.get("selector") or {}).get("matchLabels") or not spec.get("endpoints"):
            raise ValueError("ServiceMonitor needs selector.matchLabels and endpoints")
        for endpoint in spec["endpoints"]:
            if not endpoint.get("port"):
                raise ValueError("ServiceMonitor endpoint without a named port")


def check_rules(spec: dict[str, Any]) -> None:
    """Every rule of a PrometheusRule is an alert with a parseable expression and a severity."""
    import promql_parser

    groups = spec.get("groups") or []
    if not groups:
        raise ValueError("PrometheusRule without groups")
    for group in groups:
        for rule in group.get("rules") or []:
            name = rule.get("alert")
            if not name or not rule.get("expr"):
                raise ValueError("PrometheusRule rule without alert or expr")
            try:
                promql_parser.parse(rule["expr"])
            except Exception as err:
                raise ValueError(f"{name}: expression does not parse: {err}") from None
            if (rule.get("labels") or {}).get("severity") not in {"warning", "critical"}:
                raise ValueError(f"{name}: severity must be warning or critical")


def validate(doc: dict[str, Any], kube_version: str = KUBE_VERSIONS[0]) -> str:
    """Validate one manifest; returns what it was validated against (raises on errors)."""
    import kubernetes_validate

    if (doc.get("apiVersion"), doc.get("kind")) in CRDS:
        check_crd(doc)
        return "CRD structure"
    version = kubernetes_validate.validate(doc, kube_version, strict=True)
    return f"Kubernetes {version} schema (strict)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("environments", nargs="*", default=list(ENVIRONMENTS))
    parser.add_argument("--print", action="store_true", help="print the rendered manifests")
    args = parser.parse_args(argv)
    failures = 0
    for env in args.environments:
        docs = render(env)
        if args.print:
            print(yaml.safe_dump_all(docs, sort_keys=False))
            continue
        for kube in KUBE_VERSIONS:
            result = lint(env, kube)
            problems = [m for m in result.get("messages") or [] if m["severity"] > 1]
            failures += len(problems)
            print(f"== {env} on Kubernetes {kube}: helm lint --strict: {problems or 'ok'}")
            for doc in docs:
                name = f"{doc['kind']}/{doc['metadata']['name']}"
                try:
                    print(f"PASS {env:7} {name:40} {validate(doc, kube)}")
                except Exception as err:
                    failures += 1
                    print(f"FAIL {env:7} {name:40} {err}")
    print(f"{failures} failed" if failures else "all manifests valid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
