"""`mnemoflow dev` end to end: it comes up, answers, and leaves nothing behind on SIGTERM.

Runs the real command in a subprocess with a temporary data dir and free ports, waits (polling
against deadlines) for stack.json, checks that Temporal (with the custom search attributes and
the Web UI), Redis and Milvus answer, then sends SIGTERM and checks that the process and every
process it started are gone and the ports are free again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from mnemoflow.devstack.processes import free_port
from mnemoflow.devstack.stack import StackInfo, stack_path
from mnemoflow.worker.client import connect
from mnemoflow.worker.search_attributes import registered, wanted
from mnemoflow.worker.settings import TemporalSettings

pytestmark = pytest.mark.integration

START_DEADLINE_S = 180.0
STOP_DEADLINE_S = 60.0
POLL_S = 0.1
PREFIXES = ("TEMPORAL_", "MILVUS_", "REDIS_", "DEEPSEEK_", "MNEMOFLOW_")


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc (no psutil needed)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we were looking
        # The command name may contain spaces and parentheses: parse after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`."""
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pid: int) -> bool:
    """True unless the process is gone or a zombie (exited, only not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR: connections lingering in TIME_WAIT do not count, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def wait_until(condition, deadline_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {deadline_s:.0f}s waiting for {what}")
        time.sleep(POLL_S)  # polling interval, bounded by the deadline


@pytest.fixture
def dev_stack(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, dict[str, int]]]:
    """`mnemoflow dev` running on free ports; killed with its whole tree if a test fails."""
    data_dir = tmp_path / "run"
    ports = {name: free_port() for name in ("temporal", "ui", "redis", "milvus")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(PREFIXES)}
    # Offline and quick to start: heuristic models, hashing embeddings.
    env |= {"MNEMOFLOW_MODELS": "heuristic", "MILVUS_EMBEDDING": "hashing"}
    argv = [sys.executable, "-m", "mnemoflow.ops.cli", "dev", "--data-dir", str(data_dir)]
    for name, port in ports.items():
        argv += [f"--{name}-port", str(port)]
    log = (tmp_path / "dev.log").open("wb")
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        yield proc, data_dir, ports
    finally:
        leftovers = descendants(proc.pid)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_DEADLINE_S)
        for pid in leftovers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        log.close()


async def _check_services(info: StackInfo) -> None:
    client = await connect(TemporalSettings(address=info.temporal_address))
    assert wanted().items() <= (await registered(client)).items()

    redis = aioredis.Redis.from_url(info.redis_url)
    try:
        assert await redis.ping()
    finally:
        await redis.aclose()

    def milvus_collections() -> list[str]:
        from pymilvus import MilvusClient

        milvus = MilvusClient(uri=info.milvus_uri)
        try:
            return list(milvus.list_collections())
        finally:
            milvus.close()

    assert "mnemoflow_fragments" in await asyncio.to_thread(milvus_collections)

    assert info.ui_url is not None
    ui_url = info.ui_url

    def ui_status() -> int:
        with urllib.request.urlopen(ui_url, timeout=10) as response:
            return int(response.status)

    assert await asyncio.to_thread(ui_status) == 200


async def test_dev_stack_starts_answers_and_stops_cleanly(
    dev_stack: tuple[subprocess.Popen[bytes], Path, dict[str, int]],
) -> None:
    proc, data_dir, ports = dev_stack
    stack_file = stack_path(data_dir)

    def ready() -> bool:
        if proc.poll() is not None:
            log = (data_dir.parent / "dev.log").read_text(errors="replace")
            raise AssertionError(f"mnemoflow dev exited with {proc.returncode}:\n{log[-4000:]}")
        return stack_file.exists()

    await asyncio.to_thread(wait_until, ready, START_DEADLINE_S, "stack.json")
    info = StackInfo.model_validate_json(stack_file.read_text())
    assert info.temporal_address == f"127.0.0.1:{ports['temporal']}"
    assert info.redis_url == f"redis://127.0.0.1:{ports['redis']}/0"
    assert info.milvus_uri == f"http://127.0.0.1:{ports['milvus']}"
    assert info.ui_url == f"http://127.0.0.1:{ports['ui']}"
    assert info.pid == proc.pid
    assert (data_dir / "temporal.db").exists()

    await _check_services(info)

    # Milvus Lite allows one process per data dir: a second stack on it must refuse to start.
    second = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "mnemoflow.ops.cli", "dev", "--data-dir", str(data_dir)],
        capture_output=True,
        timeout=STOP_DEADLINE_S,
    )
    assert second.returncode == 1
    assert b"already runs" in second.stderr

    tree = descendants(proc.pid)
    assert tree, "the dev stack should have started service processes"
    proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(proc.wait, STOP_DEADLINE_S)
    assert proc.returncode == 0, (data_dir.parent / "dev.log").read_text(errors="replace")[-4000:]

    def all_gone() -> bool:
        return not any(alive(pid) for pid in tree)

    await asyncio.to_thread(wait_until, all_gone, STOP_DEADLINE_S, f"children {sorted(tree)}")

    def ports_free() -> bool:
        return all(bindable(port) for port in ports.values())

    await asyncio.to_thread(wait_until, ports_free, STOP_DEADLINE_S, f"ports {ports}")
    assert not stack_file.exists()
