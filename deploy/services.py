"""Render Temporal's own Helm chart with `deploy/temporal-values.yaml`, offline, and validate it.

Temporal's chart is not vendored here: give the path of a checkout or an unpacked release of
temporalio/helm-charts' `charts/temporal`. Its templates refuse to render without persistence
values (no database is bundled); this shows ours render, that every manifest validates
strictly for each Kubernetes version of `deploy.manifests`, and that the frontend Service and
pod labels are the ones the mnemoflow chart's defaults point at (TEMPORAL_ADDRESS and the
NetworkPolicy's selector).

    python -m deploy.services PATH/TO/charts/temporal
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from deploy import manifests

TEMPORAL_VALUES = manifests.DEPLOY / "temporal-values.yaml"


def render_temporal(chart: Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Temporal's chart rendered as release `temporal` in namespace `temporal`."""
    from helm_python import Chart

    given = yaml.safe_load(TEMPORAL_VALUES.read_text()) if values is None else values
    with Chart.load(chart) as loaded:
        files = loaded.render(given, name="temporal", namespace="temporal", is_install=True)
    return [
        d for n in sorted(files) if n.endswith(".yaml") for d in yaml.safe_load_all(files[n]) if d
    ]


def check_temporal(docs: list[dict[str, Any]]) -> list[str]:
    """Problems with the rendered Temporal manifests (empty = none)."""
    problems = []
    for doc in docs:
        for kube in manifests.KUBE_VERSIONS:
            try:
                manifests.validate(doc, kube)
            except Exception as err:
                problems.append(f"{doc['kind']}/{doc['metadata']['name']} on {kube}: {err}")
    defaults = manifests.render("default")
    address = next(d for d in defaults if d["kind"] == "ConfigMap")["data"]["TEMPORAL_ADDRESS"]
    host, port = address.split(":")
    service = host.split(".")[0]
    frontend = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == service]
    if not frontend or int(port) not in {p["port"] for p in frontend[0]["spec"]["ports"]}:
        problems.append(f"no Service {service} on port {port} (TEMPORAL_ADDRESS={address})")
    policy = next(d for d in defaults if d["kind"] == "NetworkPolicy")
    wanted = next(
        peer["podSelector"]["matchLabels"]
        for rule in policy["spec"]["egress"]
        for peer in rule["to"]
        if any(p["port"] == int(port) for p in rule["ports"])
    )
    pods = [
        d["spec"]["template"]["metadata"]["labels"]
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-frontend")
    ]
    if not any(wanted.items() <= labels.items() for labels in pods):
        problems.append(f"no frontend pod labelled {wanted} (the NetworkPolicy's selector)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chart", type=Path, help="path of Temporal's charts/temporal")
    args = parser.parse_args(argv)
    docs = render_temporal(args.chart)
    problems = check_temporal(docs)
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"{len(docs)} Temporal manifests: " + ("invalid" if problems else "all valid"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
