"""Operator commands say which services they use, and never fall back to one silently."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mnemoflow.devstack.stack import StackInfo, write_stack
from mnemoflow.ops import cli
from mnemoflow.ops.target import NoTargetError, resolve_target
from mnemoflow.worker.settings import Settings

_ENV = ("TEMPORAL_ADDRESS", "TEMPORAL_TASK_QUEUE", "REDIS_URL", "MILVUS_URI", "MNEMOFLOW_DATA_DIR")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("MNEMOFLOW_DATA_DIR", str(home))
    return home


def _running_stack(data_dir: Path, port: int) -> StackInfo:
    # The stack file names a live process (this one), so read_stack takes it as running.
    info = StackInfo(
        temporal_address=f"127.0.0.1:{port}",
        task_queue=f"queue-{port}",
        ui_url=None,
        redis_url=f"redis://127.0.0.1:{port + 1}/0",
        milvus_uri=f"http://127.0.0.1:{port + 2}",
        data_dir=str(data_dir),
        pid=os.getpid(),
    )
    write_stack(info)
    return info


def test_data_dir_points_at_the_stack_running_there(clean_env: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    _running_stack(clean_env, 17000)
    _running_stack(other, 27000)
    target = resolve_target(Settings.load(), other)
    assert target.settings.temporal.address == "127.0.0.1:27000"
    assert target.settings.temporal.task_queue == "queue-27000"
    assert target.settings.redis.url == "redis://127.0.0.1:27001/0"
    assert target.settings.milvus.uri == "http://127.0.0.1:27002"
    assert str(other) in target.description


def test_data_dir_without_a_running_stack_is_an_error(clean_env: Path, tmp_path: Path) -> None:
    with pytest.raises(NoTargetError, match="no running mnemoflow dev stack in"):
        resolve_target(Settings.load(), tmp_path / "nothing-here")


def test_a_dead_stack_file_does_not_count(clean_env: Path) -> None:
    info = _running_stack(clean_env, 17000)
    write_stack(info.model_copy(update={"pid": _dead_pid()}))
    with pytest.raises(NoTargetError, match="TEMPORAL_ADDRESS is not set"):
        resolve_target(Settings.load())


def test_configured_address_wins_over_a_stack_in_the_default_dir(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _running_stack(clean_env, 17000)
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example.internal:7233")
    target = resolve_target(Settings.load())
    assert target.settings.temporal.address == "temporal.example.internal:7233"
    assert "TEMPORAL_ADDRESS" in target.description


def test_default_dir_stack_is_used_when_nothing_is_configured(clean_env: Path) -> None:
    _running_stack(clean_env, 17000)
    target = resolve_target(Settings.load())
    assert target.settings.temporal.address == "127.0.0.1:17000"


def test_nothing_configured_and_no_stack_is_an_error_not_localhost(clean_env: Path) -> None:
    with pytest.raises(NoTargetError) as err:
        resolve_target(Settings.load())
    assert "mnemoflow dev" in str(err.value) and "--data-dir" in str(err.value)


@pytest.mark.parametrize("command", ["inspect", "forget", "rounds", "retry"])
def test_every_command_that_talks_to_services_takes_data_dir(
    command: str, clean_env: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [command, "u", *(["event-1"] if command == "retry" else [])]
    code = cli.main([*argv, "--data-dir", str(tmp_path / "none")])
    assert code == 2
    err = capsys.readouterr().err
    assert f"mnemoflow {command}: no running mnemoflow dev stack in" in err
    # and without any target at all, the same clear refusal instead of 127.0.0.1:7233
    assert cli.main(argv) == 2
    assert "TEMPORAL_ADDRESS is not set" in capsys.readouterr().err


def _dead_pid() -> int:
    # A pid that certainly is not running: one past the kernel's maximum.
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
