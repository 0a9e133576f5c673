"""One way for the process side (CLI, demo, examples) to build a MemoryClient from settings."""

from __future__ import annotations

from typing import Any

from mnemoflow.middleware import MemoryClient
from mnemoflow.models.config import MemoryConfig
from mnemoflow.worker.settings import Settings


def memory_client(
    temporal: Any,
    settings: Settings,
    config: MemoryConfig | None = None,
    embeddings: Any = None,
) -> MemoryClient:
    """A MemoryClient on the settings' task queues, Redis and pseudonymity."""
    return MemoryClient(
        temporal=temporal,
        task_queue=settings.temporal.task_queue,
        redis=settings.redis.url,
        key_prefix=settings.redis.key_prefix,
        config=config,
        llm_task_queue=settings.temporal.llm_task_queue,
        user_key_secret=settings.user_key_secret(),
        embeddings=embeddings,
    )
