"""The search corpus in Redis, written by the worker as it indexes fragments (models.corpus).

Like the read model it is a cache: everything in it can be rebuilt from the fragment store, and
a failed write fails the index activity, whose retry rewrites the same fields (fragment ids are
business ids). The redis client is built without its own retries: Temporal's are the only ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis.asyncio as aioredis

from mnemoflow.models.corpus import CorpusEntry, corpus_key, corpus_version_key, encode_vector
from mnemoflow.models.fragments import Fragment


class SearchCorpus:
    """Add, remove and drop users' corpus entries; one instance per worker process."""

    def __init__(self, redis: str | aioredis.Redis, prefix: str, *, timeout_s: float = 2.0):
        if isinstance(redis, str):
            redis = aioredis.Redis.from_url(
                redis, retry=None, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        self._redis = redis
        self.prefix = prefix

    async def close(self) -> None:
        """Close the client's connections."""
        await self._redis.aclose()

    async def add(self, fragments: Sequence[Fragment], vectors: Sequence[Sequence[float]]) -> None:
        """Write the fragments (same id: replaced) and bump each user's version, atomically."""
        by_user: dict[str, dict[str | bytes, str | bytes]] = {}
        for frag, vec in zip(fragments, vectors, strict=True):
            entry = CorpusEntry(
                id=frag.id,
                theme=frag.theme,
                types=list(frag.types),
                content=frag.content,
                thread_id=frag.thread_id,
                start_pos=frag.start_pos,
                end_pos=frag.end_pos,
                created_at=frag.created_at,
                strengthen_count=frag.strengthen_count,
                vector=encode_vector(vec),
            )
            by_user.setdefault(frag.user_id, {})[frag.id] = entry.model_dump_json()
        if not by_user:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for user_id, mapping in by_user.items():
                pipe.hset(corpus_key(self.prefix, user_id), mapping=mapping)  # type: ignore[arg-type]
                pipe.incr(corpus_version_key(self.prefix, user_id))
            await pipe.execute()

    async def exists(self, user_id: str) -> bool:
        """Whether the user's corpus is there (its version key survives any write)."""
        return bool(await self._redis.exists(corpus_version_key(self.prefix, user_id)))

    async def remove(self, user_id: str, ids: Sequence[str]) -> None:
        """Drop some of the user's entries (absent ids are fine)."""
        if not ids:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hdel(corpus_key(self.prefix, user_id), *ids)
            pipe.incr(corpus_version_key(self.prefix, user_id))
            await pipe.execute()

    async def delete_user(self, user_id: str) -> None:
        """Drop the user's whole corpus (forget); the version key goes too."""
        await self._redis.delete(
            corpus_key(self.prefix, user_id), corpus_version_key(self.prefix, user_id)
        )
