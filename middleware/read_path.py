"""The hot path's read of a user's injected context: one Redis GET, the workflow query as the
fallback, and nothing when both fail (a turn without memory, never a failed turn).

The read model's key is `models.ids.context_key` and its value is decoded by
`models.contracts.parse_published`, as the publishing activity writes them. The redis client is
built without its own retries: the hot path prefers a fast miss to a slow hit.

After a clean miss the workflow's answer serves later calls, but only while the user's corpus
version (`models.corpus.corpus_version_key`, read in the same round trip) is the one seen when
that answer was asked for: a forget in any process deletes it, so no process keeps serving a
forgotten context (a round moving it only makes the answer be asked again). When the version key
is absent too (Redis lost the user's keys), the background query starts one first
(`models.corpus.START_VERSION`), since an answer checked against "absent" would stay valid
across a forget that finds nothing to delete.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from mnemoflow.models.contracts import InjectedContext, parse_published
from mnemoflow.models.corpus import START_VERSION, corpus_version, corpus_version_key
from mnemoflow.models.errors import MemoryUnavailableError
from mnemoflow.models.ids import context_key, epoch_key

log = logging.getLogger(__name__)

#: After a clean read-model miss, ask the workflow (in the background) at most this often.
MISS_REQUERY_S = 5.0
#: Users whose background query answer is kept in process.
MAX_MISS_CACHE = 10_000

#: The workflow's `context` query for a (validated) user id; raises MemoryUnavailableError or
#: LookupError (no workflow).
ContextQuery = Callable[[str], Awaitable[InjectedContext]]


class ContextReader:
    """Reads published contexts; one per MemoryClient."""

    def __init__(
        self,
        redis: aioredis.Redis | str | None,
        key_prefix: str,
        timeout_s: float,
        query: ContextQuery,
    ) -> None:
        """`redis`: a URL (a client is built, and closed by `aclose`), a client (the caller's),
        or None (every read asks the workflow)."""
        self.key_prefix = key_prefix
        self.timeout_s = timeout_s
        self._query = query
        self._owns_redis = isinstance(redis, str)
        if isinstance(redis, str):
            redis = aioredis.Redis.from_url(
                redis, retry=None, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        self.redis: aioredis.Redis | None = redis
        # Answers of background queries after clean read-model misses (when, what, the corpus
        # version seen when it was asked for), and those in flight.
        self._queried: OrderedDict[
            str, tuple[float, InjectedContext | None, bytes | str | None]
        ] = OrderedDict()
        self._querying: dict[str, asyncio.Task[None]] = {}
        # The highest forget epoch seen per user (docs/ARCHITECTURE.md, "Forget epochs").
        self._epochs: OrderedDict[str, int] = OrderedDict()

    async def forget_epoch(self, uid: str) -> int | None:
        """The user's forget epoch, for the messages of a turn starting now: one Redis GET
        (the key is written at 0 when the user's workflow starts or publishes; absent, the one
        this process saw before, else the workflow's `context` query says it, 0 when there is
        no workflow), never lower than one seen before by this process
        (a forget's receipt, a context). When Redis does not answer in time, the highest seen
        before (no forget completes while Redis is down: it records the epoch there first), or
        None when none was. Without Redis, the workflow's `context` query says it (None when
        the query fails: a process that kept an epoch it saw would never learn of another
        process's forget). Unstamped messages are judged by the time fence. Never raises."""
        if self.redis is None:
            try:
                return (await self._query(uid)).forget_epoch
            except (MemoryUnavailableError, LookupError):
                return None
        try:
            async with asyncio.timeout(self.timeout_s):
                raw = await self.redis.get(epoch_key(self.key_prefix, uid))
            if raw is not None:
                self.saw_epoch(uid, int(raw))
        except Exception as err:  # memory never fails a turn: the last epoch seen
            log.debug("forget epoch unavailable: %r", err)
            return self._epochs.get(uid)
        if raw is None and uid not in self._epochs:
            # Absent: the user's workflow never started (no forget yet), or Redis lost the key.
            # Taking it for 0 would refuse every line of a user forgotten before the loss, and
            # the time fence needs the clocks to agree: the workflow says (once per process;
            # docs/ARCHITECTURE.md, "Forget epochs"). No workflow: nothing to refuse against,
            # and 0 is kept like an answer (a forget from now on writes its epoch to Redis
            # first), so the user's next turns, while the workflow the first turn started has
            # not written the key yet, do not wait for its query (~60 ms on a busy worker).
            try:
                self.saw_epoch(uid, (await self._query(uid)).forget_epoch)
            except LookupError:
                self.saw_epoch(uid, 0)
                return 0
            except Exception as err:  # memory never fails a turn: unknown, the time fence
                log.debug("forget epoch unavailable: %r", err)
        return self._epochs.get(uid)

    def saw_epoch(self, uid: str, epoch: int) -> None:
        """Remember a forget epoch of the user this process learnt (never lowered)."""
        self._epochs[uid] = max(epoch, self._epochs.get(uid, 0))
        self._epochs.move_to_end(uid)
        while len(self._epochs) > MAX_MISS_CACHE:
            self._epochs.popitem(last=False)

    def known_epoch(self, uid: str) -> int | None:
        """The highest forget epoch of the user this process saw (None: none)."""
        return self._epochs.get(uid)

    async def context(self, uid: str) -> InjectedContext | None:
        """Redis, else the workflow query, else None; never raises.

        The query is awaited only when Redis fails (or holds an unreadable value); when Redis
        simply has nothing for the user, the query runs in the background and its answer serves
        later calls.
        """
        return (await self.context_at(uid))[0]

    async def context_at(self, uid: str) -> tuple[InjectedContext | None, int | None]:
        """`context`, and the user's corpus version read in the same round trip (None when
        Redis gave no answer): a search that read another version is out of date."""
        reachable, cached, version = await self._state(uid)
        seen = corpus_version(version) if reachable or cached is not None else None
        if cached is not None:
            return cached, seen
        if reachable:
            # Redis answered "nothing published yet": the workflow has nothing newer to say
            # unless the read model was lost, so ask it off the turn (measured: the query
            # waits 30-200 ms on a busy worker, every turn until the first round publishes).
            return self._miss(uid, version), seen
        try:
            return await self._query(uid), seen
        except (MemoryUnavailableError, LookupError):
            return None, seen

    async def cached(self, uid: str) -> InjectedContext | None:
        """What Redis holds; None on a miss, a bad value or any Redis error."""
        return (await self._state(uid))[1]

    async def _read(self, uid: str) -> tuple[InjectedContext | None, bytes | str | None]:
        """`published` and the corpus version, in one round trip."""
        if self.redis is None:
            raise LookupError("this client reads no read model (no Redis configured)")
        keys = [context_key(self.key_prefix, uid), corpus_version_key(self.key_prefix, uid)]
        async with asyncio.timeout(self.timeout_s):
            raw, version = await self.redis.mget(keys)
        return parse_published(raw), version

    async def published(self, uid: str) -> InjectedContext | None:
        """The one GET of the read model: None when absent, ValueError when unreadable, and
        Redis errors (or TimeoutError after `timeout_s`) as they come."""
        if self.redis is None:
            raise LookupError("this client reads no read model (no Redis configured)")
        async with asyncio.timeout(self.timeout_s):
            raw = await self.redis.get(context_key(self.key_prefix, uid))
        return parse_published(raw)

    async def aclose(self) -> None:
        """Stop background queries; close the Redis client if this reader built it."""
        for task in list(self._querying.values()):
            task.cancel()
        await asyncio.gather(*self._querying.values(), return_exceptions=True)
        if self.redis is not None and self._owns_redis:
            await self.redis.aclose()

    async def _state(self, uid: str) -> tuple[bool, InjectedContext | None, bytes | str | None]:
        """(Redis answered with no usable value = a clean miss, the context, the corpus
        version). A Redis error or an unreadable value is not a clean miss: the caller then
        queries the workflow."""
        if self.redis is None:
            return False, None, None
        try:
            context, version = await self._read(uid)
        except ValueError:
            log.warning("unreadable read-model value; using the workflow query")
            return False, None, None
        except Exception as err:  # any Redis failure means "use the fallback"
            log.debug("read model unavailable: %r", err)
            return False, None, None
        if context is None:
            return True, None, version  # `_miss` serves what the background query found
        # Redis holds the context again: an earlier background answer is stale from now on.
        self._queried.pop(uid, None)
        self.saw_epoch(uid, context.forget_epoch)
        return False, context, version

    async def _start_version(self, uid: str) -> bytes | str:
        assert self.redis is not None  # a clean miss came from Redis
        async with asyncio.timeout(self.timeout_s):
            started = await self.redis.eval(  # type: ignore[misc]
                START_VERSION, 1, corpus_version_key(self.key_prefix, uid)
            )
        return started if isinstance(started, (bytes, str)) else str(started)

    def drop(self, uid: str) -> None:
        """Forget what a background query found for the user (after a forget, it may hold a
        forgotten fragment); the next clean miss asks the workflow again."""
        self._queried.pop(uid, None)

    def _miss(self, uid: str, version: bytes | str | None) -> InjectedContext | None:
        """On a clean Redis miss: what an earlier background query found (or None) while the
        corpus version is the one it was asked at, and a new background query at most every
        MISS_REQUERY_S per user. Never waits."""
        now = time.monotonic()
        found_at, found, seen = self._queried.get(uid, (float("-inf"), None, None))
        if found is not None and corpus_version(seen) != corpus_version(version):
            found = None  # forgotten (the version was deleted) or changed since: not served
        if uid not in self._querying and now - found_at >= MISS_REQUERY_S:
            task = asyncio.get_running_loop().create_task(self._query_later(uid, version))
            self._querying[uid] = task
        return found

    async def _query_later(self, uid: str, version: bytes | str | None) -> None:
        try:
            if version is None:
                # No corpus version to check the answer against (Redis lost the user's keys):
                # start one before asking, so that a forget, which deletes it, shows.
                version = await self._start_version(uid)
            found = await self._query(uid)
        except (MemoryUnavailableError, LookupError):
            found = None
        except Exception as err:  # Redis failed: an answer nothing can check is not kept
            log.debug("corpus version not started: %r", err)
            found = None
        finally:
            self._querying.pop(uid, None)
        self._queried[uid] = (time.monotonic(), found, version)
        self._queried.move_to_end(uid)
        while len(self._queried) > MAX_MISS_CACHE:
            self._queried.popitem(last=False)
