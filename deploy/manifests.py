"""Render the Helm chart offline and validate every manifest (`make deploy-check`).

Rendering uses the real Helm engine (the `helm-python-sdk` wheel embeds it; no helm binary, no
cluster, no network). Built-in kinds are validated with `kubernetes-validate` in strict mode
(unknown fields are errors) against the Kubernetes schemas it ships; the two CRDs (KEDA
ScaledObject, Prometheus Operator ServiceMonitor) have no schema available offline here and are
checked structurally by `check_crd`.

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
#: Oldest Kubernetes the manifests must be valid for (policy/v1, networking/v1, autoscaling).
KUBE_VERSION = "1.29.0"
CRDS = {("keda.sh/v1alpha1", "ScaledObject"), ("monitoring.coreos.com/v1", "ServiceMonitor")}


def values(environment: str) -> dict[str, Any]:
    """The values file of an environment ({} for the chart defaults)."""
    path = ENVIRONMENTS[environment]
    return {} if path is None else yaml.safe_load(path.read_text())


def render(
    environment: str, release: str = "mf", namespace: str = "mnemoflow"
) -> list[dict[str, Any]]:
    """Every manifest of the chart for an environment, as dicts."""
    from helm_python import Chart

    with Chart.load(CHART) as chart:
        files = chart.render(
            values(environment), name=release, namespace=namespace, is_install=True
        )
    docs: list[dict[str, Any]] = []
    for name in sorted(files):
        if not name.endswith((".yaml", ".yml")):
            continue
        docs += [d for d in yaml.safe_load_all(files[name]) if d]
    return docs


def lint(environment: str) -> dict[str, Any]:
    """`helm lint --strict` of the chart with an environment's values."""
    from helm_python.chart import lint as helm_lint

    return helm_lint(CHART, values(environment), strict=True, kube_version=KUBE_VERSION)


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
    else:
        if not (spec.get("selector") or {}).get("matchLabels") or not spec.get("endpoints"):
            raise ValueError("ServiceMonitor needs selector.matchLabels and endpoints")
        for endpoint in spec["endpoints"]:
            if not endpoint.get("port"):
                raise ValueError("ServiceMonitor endpoint without a named port")


def validate(doc: dict[str, Any]) -> str:
    """Validate one manifest; returns what it was validated against (raises on errors)."""
    import kubernetes_validate

    if (doc.get("apiVersion"), doc.get("kind")) in CRDS:
        check_crd(doc)
        return "CRD structure"
    version = kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
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
        result = lint(env)
        print(f"== {env}: helm lint --strict: {result.get('messages') or 'ok'}")
        for doc in docs:
            name = f"{doc['kind']}/{doc['metadata']['name']}"
            try:
                print(f"PASS {env:7} {name:48} {validate(doc)}")
            except Exception as err:
                failures += 1
                print(f"FAIL {env:7} {name:48} {err}")
    print(f"{failures} failed" if failures else "all manifests valid")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
