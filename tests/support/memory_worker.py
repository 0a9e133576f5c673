"""A real memory worker for tests: the production wiring, real Milvus and Redis.

Each call gets its own task queue, Milvus collection and Redis key prefix, so tests never see
each other's data. Memory models and embeddings are injected as `Components` (offline ones in
tests), through the same `running_worker` that `mnemoflow worker` runs.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.service import RPCError

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.read_model import ReadModel
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.settings import (
    DeepSeekSettings,
    MilvusSettings,
    MnemoflowSettings,
    RedisSettings,
    Settings,
    TemporalSettings,
)
from tests.support.drive import STARTED

if TYPE_CHECKING:
    # Imported where used: the middleware pulls in LangChain (about a second), which the worker
    # processes of tests/support/worker_process.py (importing `worker_settings`) do not need.
    from mnemoflow.middleware.client import MemoryClient


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
        from mnemoflow.middleware.client import MemoryClient

        if "milvus_uri" not in options:
            options = {
                "milvus_uri": self.store.uri,
                "milvus_collection": self.store.collection,
                **options,
            }
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


def worker_settings(
    *, task_queue: str, milvus_uri: str, collection: str, redis_url: str, key_prefix: str
) -> Settings:
    """Settings of a test worker: its own queue, collection and prefix, offline models.

    A short graceful shutdown: a test's workflows are terminated before its worker stops, so
    nothing is left to drain and a long wait would only slow the suite down.
    """
    return Settings(
        temporal=TemporalSettings(task_queue=task_queue),
        milvus=MilvusSettings(uri=milvus_uri, collection=collection, embedding="hashing"),
        redis=RedisSettings(url=redis_url, key_prefix=key_prefix),
        deepseek=DeepSeekSettings(),
        mnemoflow=MnemoflowSettings(models="heuristic", graceful_shutdown_s=1.0),
    )


def fresh_settings(milvus_uri: str, redis_url: str, **mnemoflow: Any) -> Settings:
    """`worker_settings` with a task queue, collection and prefix no other test uses;
    `mnemoflow` overrides MnemoflowSettings fields (e.g. Worker Versioning)."""
    tag = uuid.uuid4().hex[:10]
    settings = worker_settings(
        task_queue=f"tq-{tag}",
        milvus_uri=milvus_uri,
        collection=f"t_{tag}",
        redis_url=redis_url,
        key_prefix=f"test:{tag}:",
    )
    own = settings.mnemoflow.model_copy(update=mnemoflow)
    return settings.model_copy(update={"mnemoflow": own})


@asynccontextmanager
async def memory_worker(
    client: Client,
    *,
    milvus_uri: str,
    redis_url: str,
    models: Any,
    embeddings: Any | None = None,
    store_cls: type[FragmentStore] | None = None,
) -> AsyncIterator[MemoryWorker]:
    """Run the production wiring (worker.app.running_worker) for the duration of the block,
    with the given models and embeddings (and a FragmentStore subclass, e.g. one that holds
    some calls); the store clients are closed after."""
    settings = fresh_settings(milvus_uri, redis_url)
    embedder = embeddings or HashingEmbeddings()
    store = None
    if store_cls is not None:
        store = store_cls(
            settings.milvus.uri, embedder, collection=settings.milvus.collection, lines=True
        )
    components = Components(models=models, embeddings=embedder, store=store)
    try:
        async with running_worker(client, settings, components) as res:
            task_queue = settings.temporal.task_queue
            try:
                yield MemoryWorker(client, task_queue, res.store, res.read_model, models)
            finally:
                await terminate_started(client, task_queue)
    finally:
        if store is not None:
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
