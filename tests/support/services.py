"""Real service processes for the test session: a redis-server and a Milvus Lite server.

Started once per session on free loopback ports, in pytest's temporary directories, through the
same launchers as the `mnemoflow dev` stack (devstack.processes), and stopped at the end. Tests
share the servers and isolate themselves with unique names (`unique_name`), never by
restarting anything.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from mnemoflow.devstack.processes import (
    LOOPBACK,
    ManagedProcess,
    ServiceStartError,
    free_port,
    start_milvus_lite,
    start_redis,
)

# free_port() can lose a race with another process grabbing the port before the server binds.
_START_ATTEMPTS = 3
# How long a session server gets to exit on its stop signal before it is killed. Its data dir
# is thrown away with the session, so a graceful stop keeps nothing. After a full suite, Milvus
# Lite's graceful stop (a 5 s drain, then closing every collection the suite left) ran past
# ManagedProcess.stop's default 10 s and was killed anyway: 10 s added to the last test's
# teardown.
_STOP_TIMEOUT_S = 2.0


def _start(launch: Callable[[int, Path], ManagedProcess], data_dir: Path) -> ManagedProcess:
    error: ServiceStartError | None = None
    for attempt in range(_START_ATTEMPTS):
        try:
            return launch(free_port(), data_dir / f"attempt-{attempt}")
        except ServiceStartError as exc:
            error = exc
    assert error is not None
    raise error


@contextmanager
def _serving(
    launch: Callable[[int, Path], ManagedProcess], data_dir: Path, url: str
) -> Iterator[str]:
    """`url` (a format with {port}) of a server started by `launch`, stopped on the way out."""
    proc = _start(launch, data_dir)
    try:
        yield url.format(port=proc.port)
    finally:
        proc.stop(timeout=_STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a redis-server running for the whole session."""
    url = f"redis://{LOOPBACK}:{{port}}/0"
    with _serving(start_redis, tmp_path_factory.mktemp("redis"), url) as running:
        yield running


@pytest.fixture(scope="session")
def milvus_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URI of a Milvus Lite server running for the whole session."""
    url = f"http://{LOOPBACK}:{{port}}"
    with _serving(start_milvus_lite, tmp_path_factory.mktemp("milvus"), url) as running:
        yield running


@pytest.fixture
def unique_name() -> str:
    """A name no other test uses: a Milvus collection, or a Redis key prefix with `:` added."""
    return f"t_{uuid.uuid4().hex[:12]}"
