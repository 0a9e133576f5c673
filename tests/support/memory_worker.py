"""A real memory worker for tests: both workflows, the real activities, real Milvus and Redis.

Each call gets its own task queue, Milvus collection and Redis key prefix, so tests never see
each other's data. Memory models and embeddings are injected (offline ones in tests).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.fragments import FragmentActivities
from mnemoflow.activities.llm_activities import LLMActivities
from mnemoflow.activities.read_model import ReadModel, ReadModelActivities
from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.worker.app import activity_methods
from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import STARTED


@dataclass
class MemoryWorker:
    """What a test needs to drive and inspect a running memory worker."""

    client: Client
    task_queue: str
    store: FragmentStore
    read_model: ReadModel
    models: Any

    def memory_client(self, redis_url: str | None = None, **options: Any) -> MemoryClient:
        """A MemoryClient on this worker's task queue and read-model prefix (the caller closes
        it); `redis_url` None reads context through the workflow query only."""
        return MemoryClient(
            temporal=self.client,
            task_queue=self.task_queue,
            redis=redis_url,
            key_prefix=self.read_model.prefix,
            **options,
        )

    def track(self, workflow_id: str) -> None:
        """Terminate this workflow when the worker stops (for workflows started without
        tests.support.drive.submit, e.g. by a MemoryClient)."""
        STARTED.setdefault(self.task_queue, set()).add(workflow_id)


@asynccontextmanager
async def memory_worker(
    client: Client,
    *,
    milvus_uri: str,
    redis_url: str,
    models: Any,
    embeddings: Any | None = None,
) -> AsyncIterator[MemoryWorker]:
    """Run a worker for the duration of the block; close the store clients after."""
    tag = uuid.uuid4().hex[:10]
    store = FragmentStore(
        uri=milvus_uri, embeddings=embeddings or HashingEmbeddings(), collection=f"t_{tag}"
    )
    await store.ensure()
    read_model = ReadModel.from_url(redis_url, prefix=f"test:{tag}:")
    objects = [
        LLMActivities(models, fragments=store),
        FragmentActivities(store, SearchCorpus(read_model.redis, read_model.prefix)),
        ReadModelActivities(read_model),
    ]
    task_queue = f"tq-{tag}"
    worker = Worker(
        client,
        task_queue=task_queue,
        workflows=[UserMemoryWorkflow, MemoryRoundWorkflow],
        activities=[m for obj in objects for m in activity_methods(obj)],
    )
    try:
        async with worker:
            try:
                yield MemoryWorker(client, task_queue, store, read_model, models)
            finally:
                await terminate_started(client, task_queue)
    finally:
        await read_model.close()
        await store.close()


async def terminate_started(client: Client, task_queue: str) -> None:
    """End the user workflows a test started, while their worker still runs.

    A user workflow never completes by itself; left without a worker on the shared time-skipping
    server, its next timer would hold time skipping for every later test.
    """
    for workflow_id in STARTED.pop(task_queue, set()):
        try:
            await client.get_workflow_handle(workflow_id).terminate("test finished")
        except RPCError:
            pass  # already closed
