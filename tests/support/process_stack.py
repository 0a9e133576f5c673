"""One test's multi-process memory stack: its own dev server (restartable, for outages), task
queue, collection and key prefix, a fragment store to count what was stored, a Redis client and
the agent side's MemoryClients. The test starts its worker processes itself, with
`worker_process(..., **stack.worker_args)`, so that it decides when each one starts and dies."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from temporalio.client import Client

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.middleware import MemoryClient
from tests.support.temporal import RestartableDevServer


@dataclass
class ProcessStack:
    tag: str
    prefix: str
    server: RestartableDevServer
    temporal: Client
    store: FragmentStore
    clients: list[MemoryClient]
    redis: aioredis.Redis  # to read what the workers published
    worker_args: dict[str, Any]


@asynccontextmanager
async def process_stack(
    tmp_path: Path,
    milvus_uri: str,
    redis_url: str,
    name: str,
    clients: int = 1,
    **worker: Any,
) -> AsyncIterator[ProcessStack]:
    """A started stack named `name`; `worker` adds `worker_process` options for every worker
    (for example a shorter round task timeout). Clients, store and server are closed on the
    way out, whatever state the server was left in."""
    tag = uuid.uuid4().hex[:10]
    prefix = f"test:{tag}:"
    server = RestartableDevServer(tmp_path)
    worker_args: dict[str, Any] = dict(
        address=server.address, task_queue=f"tq-{name}-{tag}", milvus=milvus_uri,
        redis=redis_url, collection=f"t_{name}_{tag}", prefix=prefix, **worker,
    )  # fmt: skip
    store = FragmentStore(  # connects on first use
        uri=milvus_uri, embeddings=HashingEmbeddings(), collection=worker_args["collection"]
    )
    made: list[MemoryClient] = []
    redis = aioredis.Redis.from_url(redis_url)  # likewise
    try:
        await server.start()
        temporal = await server.client()
        made += [
            MemoryClient(
                temporal=temporal, task_queue=worker_args["task_queue"], redis=redis_url,
                key_prefix=prefix, signal_timeout_s=2.0, close_timeout_s=60.0,
            )
            for _ in range(clients)
        ]  # fmt: skip
        yield ProcessStack(tag, prefix, server, temporal, store, made, redis, worker_args)
    finally:
        for client in made:
            await client.aclose()
        await redis.aclose()
        await store.close()
        await server.stop()
