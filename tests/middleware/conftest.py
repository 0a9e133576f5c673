"""A memory worker on the dev server and a MemoryClient on it, for the client-side tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import MemoryClient
from tests.support.memory_worker import MemoryWorker, memory_worker


@dataclass
class LiveMemory:
    """A running worker (heuristic models, real Milvus Lite and Redis) and a client on it."""

    worker: MemoryWorker
    client: MemoryClient

    def new_user(self, prefix: str) -> str:
        """A user id no other test uses; its workflow ends with the worker."""
        user = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.worker.track(self.client.workflow_id(user))
        return user


@pytest.fixture
async def live_memory(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> AsyncIterator[LiveMemory]:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        async with mw.memory_client(redis_url) as client:
            yield LiveMemory(mw, client)
