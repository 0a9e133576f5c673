"""`mnemoflow worker` as Kubernetes runs it: a subprocess configured only by environment variables.

`worker_env` gives a worker its own queue, collection and key prefix (tests that run several
processes on one set share it); `WorkerProcess` starts `python -m mnemoflow.ops.cli worker`,
logs to a file and waits on its health endpoint with deadlines.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path

from mnemoflow.devstack.processes import LOOPBACK, free_port

ROOT = Path(__file__).resolve().parents[2]
_PREFIXES = ("TEMPORAL_", "MILVUS_", "REDIS_", "DEEPSEEK_", "MNEMOFLOW_")


def _get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of GET http://127.0.0.1:port/path; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


async def get(port: int, path: str) -> tuple[int, str]:
    """`_get` off the event loop."""
    return await asyncio.to_thread(_get, port, path)


def worker_env(temporal: str, milvus_uri: str, redis_url: str, **env: str) -> dict[str, str]:
    """Settings of a test worker: a fresh queue, collection and prefix, offline models."""
    queue = f"deploy-{uuid.uuid4().hex[:8]}"
    return {
        "TEMPORAL_ADDRESS": temporal,
        "TEMPORAL_TASK_QUEUE": queue,
        "MILVUS_URI": milvus_uri,
        "MILVUS_COLLECTION": f"t_{uuid.uuid4().hex[:12]}",
        "MILVUS_EMBEDDING": "hashing",
        "REDIS_URL": redis_url,
        "REDIS_KEY_PREFIX": f"{queue}:",
        "MNEMOFLOW_MODELS": "heuristic",
        "MNEMOFLOW_HTTP_HOST": LOOPBACK,
        "MNEMOFLOW_CONNECT_RETRY_S": "0.2",
        **env,
    }


class WorkerProcess:
    """A `mnemoflow worker` subprocess with its own health and metrics ports and log file."""

    def __init__(
        self, tmp: Path, env: dict[str, str], name: str = "worker", cli_args: Sequence[str] = ()
    ) -> None:
        """`cli_args` go before the command (e.g. `-v`)."""
        self.health_port, self.metrics_port = free_port(), free_port()
        self.task_queue = env["TEMPORAL_TASK_QUEUE"]
        self.log_path = tmp / f"{name}-{uuid.uuid4().hex[:6]}.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
        full.update(
            MNEMOFLOW_HEALTH_PORT=str(self.health_port),
            MNEMOFLOW_METRICS_PORT=str(self.metrics_port),
            **env,
        )
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "mnemoflow.ops.cli", *cli_args, "worker"],
            cwd=ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    def log(self, tail: int = 3000) -> str:
        """The end of the process's output (all of it with tail=0)."""
        text = self.log_path.read_text(errors="replace")
        return text[-tail:] if tail else text

    async def wait_until(self, path: str, status: int, deadline_s: float = 90.0) -> str:
        """Poll the health endpoint until `path` answers `status`; fail if the process exits."""
        end = time.monotonic() + deadline_s
        while True:
            code, body = await get(self.health_port, path)
            if code == status:
                return body
            if self.popen.poll() is not None:
                raise AssertionError(f"worker exited {self.popen.returncode}:\n{self.log()}")
            if time.monotonic() > end:
                raise AssertionError(
                    f"{path} never gave {status} (last {code} {body}):\n{self.log()}"
                )
            await asyncio.sleep(0.1)

    async def exit_code(self, deadline_s: float) -> int:
        """Wait for the process to exit by itself (e.g. after SIGTERM); its return code."""
        try:
            return await asyncio.to_thread(self.popen.wait, deadline_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker still running after {deadline_s}s:\n{self.log()}"
            ) from None

    def stop(self) -> None:
        """Kill the process if it still runs (test clean-up) and close the log."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=30)
        self._log.close()
