"""The user's corpus version in Redis: the counter every write and delete of the user's fragments
moves (models.corpus, docs/ARCHITECTURE.md "Read path").

The per-call search reads its candidates from Milvus (the line collection) and reads this
version first, so a search that a forget in another process overtook reads as older than the
version the model call sees, and is run again; the read path checks a workflow's answer against
it too. No fragment is held in Redis: the copy of every fragment that agents once read from
here (a hash per user, `models.corpus.corpus_key`) is gone, and `drop_copies` deletes what a
deployment from before still holds.

Bumps on writes are best-effort (Redis being down never stops memory from being stored; the
next write moves the version); a bump for a deletion fails its activity, which Temporal
retries, since a search that does not see the version move could serve what was just forgotten.
The redis client is built without its own retries.

Versions never repeat for a user. After a forget (which deletes the version key) a counter
restarting at 1 would read as "unchanged" to a process that saw version 1 before the forget.
A counter that does not exist yet therefore starts at the Redis server's time in microseconds
(`BUMP_VERSION`): every later life of the key starts above every version of an earlier one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import redis.asyncio as aioredis

from mnemoflow.models.corpus import BUMP_VERSION, DELETE_STEP, corpus_key, corpus_version_key
from mnemoflow.models.fragments import Fragment

log = logging.getLogger(__name__)
#: Keys deleted per UNLINK by `drop_copies`.
_UNLINK_BATCH = 500


class SearchCorpus:
    """Move users' corpus versions; one instance per worker process."""

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

    async def bump(self, user_ids: Sequence[str], step: int = 1) -> None:
        """Move each user's version by `step` (DELETE_STEP after a delete), atomically."""
        users = sorted(set(user_ids))
        if not users:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            for user_id in users:
                pipe.eval(BUMP_VERSION, 1, corpus_version_key(self.prefix, user_id), step)
            await pipe.execute()

    async def added(self, fragments: Sequence[Fragment]) -> None:
        """After fragments were written: their users' versions moved, best-effort (logged)."""
        try:
            await self.bump([f.user_id for f in fragments])
        except Exception as err:  # any Redis failure: storing the memory matters more
            log.warning("corpus version not moved (the next write moves it): %r", err)

    async def remove(self, user_id: str, ids: Sequence[str]) -> None:
        """After some of the user's fragments were deleted: the version moves (raises)."""
        if ids:
            await self.bump([user_id], DELETE_STEP)

    async def delete_user(self, user_id: str) -> None:
        """Forget: the version key goes (the next write starts a new counter above every
        version this one reached: `BUMP_VERSION`), with a fragment copy from before."""
        await self._redis.delete(
            corpus_key(self.prefix, user_id), corpus_version_key(self.prefix, user_id)
        )


async def drop_copies(redis: aioredis.Redis, prefix: str) -> int:
    """Delete every user's fragment copy that a deployment from before the line collection
    wrote to Redis (`<prefix>corpus:<user key>`; the versions, `<prefix>corpusv:...`, stay).
    Returns how many were deleted."""
    deleted, batch = 0, []
    async for key in redis.scan_iter(match=f"{_glob(prefix)}corpus:*", count=1000):
        batch.append(key)
        if len(batch) >= _UNLINK_BATCH:
            deleted += int(await redis.unlink(*batch))
            batch = []
    if batch:
        deleted += int(await redis.unlink(*batch))
    return deleted


def _glob(text: str) -> str:
    """`text` with Redis's glob characters escaped."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
