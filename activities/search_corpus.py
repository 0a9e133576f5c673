"""The search corpus in Redis, written by the worker as it indexes fragments (models.corpus).

Like the read model it is a cache of the fragment store, so Redis being down must not stop
memory from being stored: the index activity writes it best-effort, and every round's selection
reconciles it with the store (`reconcile`: what is missing is added, what the store no longer
holds is dropped), which also rebuilds a corpus Redis lost. Deletions are the exception: a
forgotten fragment must leave the corpus too, so a failed removal fails its activity, which
Temporal retries. The redis client is built without its own retries.

Versions never repeat for a user. The agent process rebuilds its cached index only when the
version moved, so after a forget (which deletes the version key with the rest of the corpus) a
counter restarting at 1 would read as "unchanged" to a process that cached version 1 before the
forget, and it would keep injecting the forgotten fragments. A counter that does not exist yet
therefore starts at the Redis server's time in microseconds (`BUMP_VERSION`): every later life
of the key starts above every version of an earlier one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis.asyncio as aioredis

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.models.corpus import BUMP_VERSION, CorpusEntry, corpus_key, corpus_version_key
from mnemoflow.models.fragments import Fragment

log = logging.getLogger(__name__)


class SearchCorpus:
    """Add, remove and drop users' corpus entries; one instance per worker process."""

    def __init__(
        self,
        redis: str | aioredis.Redis,
        prefix: str,
        *,
        timeout_s: float = 2.0,
        entries: bool = True,
    ):
        """`entries=False`: the per-call search reads Milvus (`FragmentStore(lines=True)`), so
        no fragment is written here; only the version counter moves, as before, on every
        write and delete (docs/ARCHITECTURE.md, "Read path")."""
        self.entries = entries
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
            entry = CorpusEntry.of_stored(frag, vec).model_dump_json() if self.entries else ""
            by_user.setdefault(frag.user_id, {})[frag.id] = entry
        if not by_user:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for user_id, mapping in by_user.items():
                if self.entries:
                    pipe.hset(corpus_key(self.prefix, user_id), mapping=mapping)  # type: ignore[arg-type]
                pipe.eval(BUMP_VERSION, 1, corpus_version_key(self.prefix, user_id))
            await pipe.execute()

    async def ids(self, user_id: str) -> set[str]:
        """The fragment ids in the user's corpus."""
        keys = await self._redis.hkeys(corpus_key(self.prefix, user_id))  # type: ignore[misc]
        return {k.decode() if isinstance(k, bytes) else str(k) for k in keys}

    async def exists(self, user_id: str) -> bool:
        """Whether the user's corpus is there (its version key survives any write)."""
        return bool(await self._redis.exists(corpus_version_key(self.prefix, user_id)))

    async def add_best_effort(
        self, fragments: Sequence[Fragment], vectors: Sequence[Sequence[float]]
    ) -> None:
        """`add`, logging instead of failing: the next selection's reconcile adds what it missed."""
        try:
            await self.add(fragments, vectors)
        except Exception as err:  # any Redis failure: storing the memory matters more
            log.warning("search corpus not updated (reconciled by the next round): %r", err)

    async def reconcile(
        self, store: FragmentStore, user_id: str, stored_ids: set[str] | None = None
    ) -> None:
        """Make the user's corpus hold exactly the store's fragments (best-effort, logged).

        `stored_ids`: the ids of all of the user's stored fragments, read from the store just
        before (a round's store step scored them all); None reads them here. Read before the
        corpus, they can miss a fragment written and added in between (a remember during the
        step): an entry they do not name is dropped only after the store is asked again.
        """
        if not self.entries:
            return
        try:
            have = await self.ids(user_id)
            if stored_ids is None:
                stored = {f.id for f in await store.all_for_user(user_id)}
            else:
                stored = set(stored_ids)
            missing, extra = stored - have, have - stored
            if extra and stored_ids is not None:
                extra -= {f.id for f in await store.all_for_user(user_id)}
            if missing:
                rows = [(f, v) for f, v in await store.all_with_vectors(user_id) if f.id in missing]
                await self.add([f for f, _ in rows], [v for _, v in rows])
                # One deleted while this ran must not come back: ask the store again.
                now_stored = {f.id for f in await store.all_for_user(user_id)}
                extra |= {f.id for f, _ in rows if f.id not in now_stored}
            await self.remove(user_id, sorted(extra))
        except Exception as err:  # a cache repair never fails a round
            log.warning("search corpus not reconciled (next round retries): %r", err)

    async def remove(self, user_id: str, ids: Sequence[str]) -> None:
        """Drop some of the user's entries (absent ids are fine)."""
        if not ids:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            if self.entries:
                pipe.hdel(corpus_key(self.prefix, user_id), *ids)
            pipe.eval(BUMP_VERSION, 1, corpus_version_key(self.prefix, user_id))
            await pipe.execute()

    async def delete_user(self, user_id: str) -> None:
        """Drop the user's whole corpus (forget); the version key goes too (the next write
        starts a new counter above every version this one reached: `BUMP_VERSION`)."""
        await self._redis.delete(
            corpus_key(self.prefix, user_id), corpus_version_key(self.prefix, user_id)
        )
