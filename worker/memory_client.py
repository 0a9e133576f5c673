"""One way for the process side (CLI, demo, examples, an application) to build a MemoryClient
from settings, so every client starts new users with the deployment's preset."""

from __future__ import annotations

from typing import Any

from mnemoflow.middleware import MemoryClient
from mnemoflow.models.config import MemoryConfig
from mnemoflow.worker.settings import Settings


def settings_config(settings: Settings) -> MemoryConfig:
    """The memory config of new users: the preset `MNEMOFLOW_VOCATION` names (customer
    service, collaborative creation or accompany: their gates and time constants)."""
    return MemoryConfig.from_vocation(settings.mnemoflow.vocation)


def memory_client(
    temporal: Any, settings: Settings, config: MemoryConfig | None = None, **options: Any
) -> MemoryClient:
    """A MemoryClient on the settings' task queues, Redis, pseudonymity and vocation preset;
    `config` replaces the preset, `options` are MemoryClient's (e.g. operator_timeout_s).
    The per-call search reads the settings' Milvus (URI, token and collection)."""
    m = settings.milvus
    token = m.token.get_secret_value() if m.token else None
    options = {
        "milvus_uri": m.uri,
        "milvus_token": token,
        "milvus_collection": m.collection,
        **options,
    }
    return MemoryClient(
        temporal=temporal,
        task_queue=settings.temporal.task_queue,
        redis=settings.redis.url,
        key_prefix=settings.redis.key_prefix,
        config=config or settings_config(settings),
        llm_task_queue=settings.temporal.llm_task_queue,
        user_key_secret=settings.user_key_secret(),
        **options,
    )
