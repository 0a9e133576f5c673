"""MNEMOFLOW_VOCATION selects the preset new users start with, wherever a client is built from
settings: a companion deployment must not run with the customer-service gates."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from mnemoflow.devstack.processes import free_port
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.models.config import PRESETS, MemoryConfig, Vocation
from mnemoflow.models.contracts import UserMemoryInput
from mnemoflow.worker.memory_client import memory_client
from mnemoflow.worker.settings import Settings
from tests.support.drive import conversation

PREFIXES = ("TEMPORAL_", "MILVUS_", "REDIS_", "DEEPSEEK_", "MNEMOFLOW_")


@pytest.fixture
def env_vocation(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(PREFIXES):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.integration
async def test_accompany_vocation_starts_users_with_the_accompany_gates(
    dev_env: WorkflowEnvironment, env_vocation: pytest.MonkeyPatch
) -> None:
    env_vocation.setenv("MNEMOFLOW_VOCATION", "accompany")
    env_vocation.setenv("TEMPORAL_TASK_QUEUE", f"nobody-{uuid.uuid4().hex[:8]}")
    settings = Settings.load()
    accompany = PRESETS[Vocation.ACCOMPANY]
    async with memory_client(dev_env.client, settings) as client:
        assert client.config.vocation is Vocation.ACCOMPANY
        assert (client.config.slice_gate, client.config.tau_m) == (0.8, accompany.tau_m)
        middleware = DurableMemoryMiddleware(client=client)
        assert middleware.config.long_term_gate == accompany.long_term_gate
        # What the user workflow gets at first contact (no worker needed to read its input).
        user = f"companion-{uuid.uuid4().hex[:8]}"
        await client.submit(user, conversation("t", ["hello", "hi"], time.time()))
        handle = dev_env.client.get_workflow_handle(client.workflow_id(user))
        try:
            history = await handle.fetch_history()
            started = history.events[0].workflow_execution_started_event_attributes
            [inp] = await dev_env.client.data_converter.decode(
                started.input.payloads, [UserMemoryInput]
            )
            assert inp.config == MemoryConfig.from_vocation("accompany")
        finally:
            await handle.terminate("test over")


async def test_default_and_explicit_config(env_vocation: pytest.MonkeyPatch) -> None:
    """No vocation set: customer service; set: that preset; an explicit config still wins."""
    temporal = await Client.connect(
        f"127.0.0.1:{free_port()}", lazy=True, data_converter=pydantic_data_converter
    )
    async with memory_client(temporal, Settings.load()) as default:
        assert default.config == MemoryConfig.from_vocation("customer service")
    env_vocation.setenv("MNEMOFLOW_VOCATION", "collaborative_creation")
    async with memory_client(temporal, Settings.load()) as creative:
        assert creative.config.vocation is Vocation.COLLABORATIVE_CREATION
        assert creative.config.slice_gate == PRESETS[Vocation.COLLABORATIVE_CREATION].slice_gate
    own = MemoryConfig.from_vocation("customer service", top_k=6)
    async with memory_client(temporal, Settings.load(), own) as explicit:
        assert explicit.config == own


async def test_settings_clients_search_through_the_settings_milvus(
    env_vocation: pytest.MonkeyPatch,
) -> None:
    """The settings' client searches through Milvus, at the settings' URI and collection; a
    client given no Milvus has no per-call search (the published context only)."""
    from mnemoflow.middleware.milvus_search import MilvusSearch

    temporal = await Client.connect(
        f"127.0.0.1:{free_port()}", lazy=True, data_converter=pydantic_data_converter
    )
    env_vocation.setenv("MILVUS_URI", "http://127.0.0.1:1")
    env_vocation.setenv("MILVUS_COLLECTION", "lines_test")
    async with memory_client(temporal, Settings.load()) as served:
        assert isinstance(served.searcher, MilvusSearch)
        assert served.searcher.uri == "http://127.0.0.1:1"
        assert served.searcher.lines == "lines_test_lines3"
    async with MemoryClient(temporal=temporal, task_queue="q") as bare:
        assert bare.searcher is None
