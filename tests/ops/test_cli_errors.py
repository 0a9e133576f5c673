"""Operator commands that cannot reach or use the services fail in one line, never a traceback
(probe 9, F3).

The CLI runs as operators run it: the installed `mnemoflow` script in its own process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.processes import LOOPBACK, free_port
from mnemoflow.models.errors import MemoryUnavailableError
from mnemoflow.ops import cli

_PREFIXES = ("TEMPORAL_", "MILVUS_", "REDIS_", "DEEPSEEK_", "MNEMOFLOW_")
_COMMANDS = {
    "inspect": ["inspect", "alice"],
    "rounds": ["rounds", "alice"],
    "forget": ["forget", "alice"],
    "retry": ["retry", "alice", "event-1"],
}


def _script() -> str:
    """The `mnemoflow` console script of this environment (what `pip install` puts on PATH)."""
    beside = Path(sys.executable).parent / "mnemoflow"
    found = str(beside) if beside.exists() else shutil.which("mnemoflow")
    assert found, "the mnemoflow script is not installed (make venv)"
    return found


def mnemoflow(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `mnemoflow ARGV` with only `env` as its mnemoflow configuration."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    full.update(env)
    return subprocess.run(
        [_script(), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=full,
        stdin=subprocess.DEVNULL,
    )


def _problem_line(result: subprocess.CompletedProcess[str], command: str) -> str:
    """The one line a failed command printed after saying which services it uses."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith(f"mnemoflow {command}: using "), result.stderr
    assert lines[1].startswith(f"mnemoflow {command}: "), result.stderr
    return lines[1]


def test_unreachable_temporal_is_one_line_naming_the_address_for_every_command(
    tmp_path: Path,
) -> None:
    """Before: a 43-line traceback ending in `RuntimeError: Failed client connect`."""
    address = f"{LOOPBACK}:{free_port()}"  # nothing listens there
    env = {"TEMPORAL_ADDRESS": address, "MNEMOFLOW_DATA_DIR": str(tmp_path)}
    with ThreadPoolExecutor(max_workers=len(_COMMANDS)) as pool:
        results = dict(
            zip(
                _COMMANDS,
                pool.map(lambda argv: mnemoflow(*argv, **env), _COMMANDS.values()),
                strict=True,
            )
        )
    for command, result in results.items():
        assert result.returncode == 1, (command, result.stderr)
        line = _problem_line(result, command)
        assert f"cannot connect to Temporal at {address}" in line, line
        assert "TEMPORAL_ADDRESS" in line and "Connection refused" in line, line
        assert result.stdout == "", result.stdout


def test_a_temporal_rpc_error_is_one_line(dev_env: WorkflowEnvironment, tmp_path: Path) -> None:
    """A namespace the server does not have: Temporal answers NOT_FOUND on the first call."""
    address = dev_env.client.service_client.config.target_host
    namespace = f"missing-{uuid.uuid4().hex[:6]}"
    env = {
        "TEMPORAL_ADDRESS": address,
        "TEMPORAL_NAMESPACE": namespace,
        "MNEMOFLOW_DATA_DIR": str(tmp_path),
    }
    result = mnemoflow("rounds", "alice", **env)
    assert result.returncode == 1, result.stderr
    line = _problem_line(result, "rounds")
    assert f"Temporal at {address} (namespace {namespace}) refused the request" in line, line
    assert "NOT_FOUND" in line, line


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (WorkflowUpdateRPCTimeoutOrCancelledError(), "did not answer in time"),
        (MemoryUnavailableError("Temporal did not answer within 60s"), "memory unavailable"),
    ],
)
def test_an_unanswered_update_is_one_line(
    error: Exception,
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An update no worker answers takes the client's 60 s update timeout to raise; the
    operation raises the real exception at once here, the CLI around it is the real one."""
    from mnemoflow.ops import inspect as ops_inspect

    async def unanswered(*args: object) -> dict[str, object]:
        raise error

    for name in ("TEMPORAL_TASK_QUEUE", "TEMPORAL_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example.internal:7233")
    monkeypatch.setenv("MNEMOFLOW_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(ops_inspect, "retry", unanswered)
    monkeypatch.setattr(ops_inspect, "forget_user", unanswered)
    for argv in (_COMMANDS["retry"], _COMMANDS["forget"]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err
        line = err.strip().splitlines()[-1]
        assert line.startswith(f"mnemoflow {argv[0]}: ") and expected in line, err
        assert "temporal.example.internal:7233" in line and "'mnemoflow'" in line, line
