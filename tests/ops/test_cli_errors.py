"""Operator commands that cannot reach or use the services fail in one line, never a traceback,
and their exit status is always the command's own (probe 9, F3 and F4).

The CLI runs as operators run it: the installed `mnemoflow` script in its own process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
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


def test_a_command_never_reaches_interpreter_finalisation(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """The cause of F4, checked deterministically: a `sitecustomize` on PYTHONPATH registers
    an atexit hook (atexit runs first in the interpreter's finalisation, which is what met
    the client's native threads). The command must end its process before that, its output
    and exit status intact."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marker = tmp_path / "finalised"
    (hooks / "sitecustomize.py").write_text(
        "import atexit, pathlib\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'finalised')\n"
    )
    address = dev_env.client.service_client.config.target_host
    path = os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env = {"TEMPORAL_ADDRESS": address, "MNEMOFLOW_DATA_DIR": str(tmp_path), "PYTHONPATH": path}
    ok = mnemoflow("rounds", "alice", **env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().endswith("(no rounds)"), ok.stdout
    assert not marker.exists(), "the interpreter's finalisation ran after `rounds`"
    # and after a command that failed (a namespace the server does not have)
    failed = mnemoflow("retry", "alice", "event-1", **{**env, "TEMPORAL_NAMESPACE": "nope"})
    assert failed.returncode == 1 and "Traceback" not in failed.stderr, failed.stderr
    assert not marker.exists(), "the interpreter's finalisation ran after a failed `retry`"


def test_the_exit_status_is_always_the_commands_own(
    dev_env: WorkflowEnvironment, tmp_path: Path
) -> None:
    """Before: 3 of 48 invocations aborted after their work (`Fatal Python error:
    PyGILState_Release`, exit 134: the Temporal client's threads met the interpreter's
    finalisation), so `$?` said a command that had succeeded had failed. Each run costs ~2 s
    of CPU (the middleware's imports): a few runs check the codes end to end, and
    test_a_command_never_reaches_interpreter_finalisation shows the cause is gone every time."""
    address = dev_env.client.service_client.config.target_host
    env = {"TEMPORAL_ADDRESS": address, "MNEMOFLOW_DATA_DIR": str(tmp_path)}
    user = f"exit-{uuid.uuid4().hex[:6]}"
    runs = 4
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: mnemoflow("rounds", user, **env), range(runs)))
    elapsed = time.monotonic() - started
    codes = [r.returncode for r in results]
    bad = [r for r in results if r.returncode != 0]
    assert codes == [0] * runs, (codes, bad[0].stderr[-1500:] if bad else "")
    for result in results:
        assert f'MnemoflowUser = "{user}"' in result.stdout and "(no rounds)" in result.stdout
    print(f"{runs} runs of `mnemoflow rounds` in {elapsed:.1f}s, exit codes {set(codes)}")
