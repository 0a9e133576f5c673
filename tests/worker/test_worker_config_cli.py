"""`mnemoflow worker` refuses a configuration it cannot run with in one line and exit status 2,
before it connects to anything (probe 9, F6). Run as Kubernetes runs it: the installed script,
configured only by environment variables."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mnemoflow.devstack.processes import LOOPBACK, free_port

_LOG = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
_PREFIXES = ("TEMPORAL_", "MILVUS_", "REDIS_", "DEEPSEEK_", "MNEMOFLOW_")


def worker(**env: str) -> subprocess.CompletedProcess[str]:
    """`mnemoflow worker` with `env` as its whole mnemoflow configuration. Temporal points at
    a port nothing listens on: a worker that got past its checks would retry there, not ready,
    until the timeout."""
    script = Path(sys.executable).parent / "mnemoflow"
    found = str(script) if script.exists() else shutil.which("mnemoflow")
    assert found, "the mnemoflow script is not installed (make venv)"
    full = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    full.update(
        TEMPORAL_ADDRESS=f"{LOOPBACK}:{free_port()}",
        MNEMOFLOW_MODELS="heuristic",
        MILVUS_EMBEDDING="hashing",
        MNEMOFLOW_HTTP_HOST=LOOPBACK,
        **env,
    )
    return subprocess.run(
        [found, "worker"],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        stdin=subprocess.DEVNULL,
    )


def _refused(result: subprocess.CompletedProcess[str], name: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    # Log records (the worker logs its redacted settings first) aside, one line says why.
    lines = [line for line in result.stderr.splitlines() if line.strip() and not _LOG.match(line)]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("mnemoflow: invalid configuration: "), lines[0]
    assert name in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("env", "name"),
    [
        # Before: a traceback (exit 1) when the worker built its models / stores / Workers.
        ({"MNEMOFLOW_HEURISTIC_LATENCY_S": "-3"}, "MNEMOFLOW_HEURISTIC_LATENCY_S"),
        ({"MNEMOFLOW_HEALTH_PORT": "99999"}, "MNEMOFLOW_HEALTH_PORT"),
        ({"MNEMOFLOW_HEALTH_PORT": "-1"}, "MNEMOFLOW_HEALTH_PORT"),
        ({"REDIS_URL": "notaurl"}, "REDIS_URL"),
        ({"MILVUS_URI": "notauri"}, "MILVUS_URI"),
        ({"MNEMOFLOW_WORKER_ROLE": "llm"}, "TEMPORAL_LLM_TASK_QUEUE"),
        # Before: a worker that started and misbehaved (never ran its LLM activities, a tight
        # reconnect loop, 0 slots silently read as 100, a raw TypeError).
        (
            {"TEMPORAL_LLM_TASK_QUEUE": "llm-q", "MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND": "0"},
            "MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND",
        ),
        ({"MNEMOFLOW_CONNECT_RETRY_S": "0"}, "MNEMOFLOW_CONNECT_RETRY_S"),
        ({"MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES": "0"}, "MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES"),
        ({"MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES": "-1"}, "MNEMOFLOW_MAX_CONCURRENT_ACTIVITIES"),
        ({"DEEPSEEK_TIMEOUT_S": "-5"}, "DEEPSEEK_TIMEOUT_S"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_2(env: dict[str, str], name: str) -> None:
    _refused(worker(**env), name)


def test_a_health_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = _refused(worker(MNEMOFLOW_HEALTH_PORT=str(port)), "MNEMOFLOW_HEALTH_PORT")
    assert f"{LOOPBACK}:{port}" in line and "in use" in line, line
