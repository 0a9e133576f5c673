"""stack.json bookkeeping and port choice of the dev stack (no services started)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from mnemoflow.devstack.embedded import DEFAULT_PORTS, DevPorts, DevStackError, choose_ports
from mnemoflow.devstack.processes import free_port
from mnemoflow.devstack.stack import (
    StackInfo,
    leftover_services,
    read_stack,
    stack_path,
    write_stack,
)
from mnemoflow.worker.settings import Settings


def _info(data_dir: Path, pid: int, service_pids: dict[str, int] | None = None) -> StackInfo:
    return StackInfo(
        temporal_address="127.0.0.1:17233",
        task_queue="q",
        ui_url=None,
        redis_url="redis://127.0.0.1:16379/0",
        milvus_uri="http://127.0.0.1:19531",
        data_dir=str(data_dir),
        pid=pid,
        service_pids=service_pids or {},
    )


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def listener() -> Iterator[int]:
    """A port something listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_round_trip_and_apply(tmp_path: Path) -> None:
    info = _info(tmp_path, os.getpid())
    assert write_stack(info) == stack_path(tmp_path)
    assert read_stack(tmp_path) == info
    settings = info.apply(Settings.load())
    assert settings.temporal.address == "127.0.0.1:17233"
    assert settings.temporal.task_queue == "q"
    assert settings.redis.url == "redis://127.0.0.1:16379/0"
    assert settings.milvus.uri == "http://127.0.0.1:19531"


def test_stack_of_a_dead_process_is_ignored(tmp_path: Path) -> None:
    assert read_stack(tmp_path) is None
    write_stack(_info(tmp_path, _exited_pid()))
    assert read_stack(tmp_path) is None


def test_leftover_services_are_found_by_pid_and_data_dir(tmp_path: Path) -> None:
    script = "import sys; sys.stdin.read()"  # lives until its stdin closes
    service = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], stdin=subprocess.PIPE)
    stranger = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        pids = {"redis": service.pid, "milvus-lite": stranger.pid, "temporal": _exited_pid()}
        write_stack(_info(tmp_path, _exited_pid(), pids))
        assert leftover_services(tmp_path) == {"redis": service.pid}
    finally:
        for proc in (service, stranger):
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)


def test_busy_default_port_falls_back(monkeypatch: pytest.MonkeyPatch, listener: int) -> None:
    monkeypatch.setattr(
        "mnemoflow.devstack.embedded.DEFAULT_PORTS", DevPorts(listener, None, None, None)
    )
    others = (free_port(), free_port(), free_port())
    ports = choose_ports(DevPorts(None, *others))
    assert ports.temporal not in (None, listener, *others)
    assert (ports.ui, ports.redis, ports.milvus) == others
    assert DEFAULT_PORTS.temporal == 7233


def test_busy_requested_port_is_an_error(listener: int) -> None:
    with pytest.raises(DevStackError, match="busy"):
        choose_ports(DevPorts(temporal=listener))
