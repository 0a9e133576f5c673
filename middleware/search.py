"""The agent process's side of the per-call memory search (README.md, "How memory is
chosen for a call").

The worker keeps every fragment of a user, with its vector, in a Redis hash (models.corpus). Here
the agent process reads it, keeps one `memory.search.SearchIndex` per user until the corpus
version moves, embeds the question and searches. The query embedding runs in this process: one
USE forward pass takes ~3 ms on a core, while a round trip through the worker (a Temporal update
and an activity) costs tens of milliseconds and writes history on every model call. The price is
the encoder's memory in the agent process (measured ~120 MB RSS for USE multilingual); without
`embeddings` the search is lexical only.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from langchain_core.embeddings import Embeddings
from pydantic import ValidationError

from mnemoflow.memory.search import SearchDoc, SearchIndex
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.corpus import CorpusEntry, corpus_key, corpus_version, corpus_version_key
from mnemoflow.models.profile import UserProfile

log = logging.getLogger(__name__)

#: Users whose search index is kept in process (least recently used dropped first).
MAX_CACHED_USERS = 256


def build_index(raw: dict[Any, Any], version: int = 0) -> SearchIndex:
    """A search index from the corpus hash read at `version` (unreadable entries are skipped;
    vectors are used only when every entry has one of the same size)."""
    entries: list[CorpusEntry] = []
    for value in raw.values():
        try:
            entries.append(CorpusEntry.model_validate_json(value))
        except ValidationError:
            log.warning("unreadable corpus entry skipped")
    entries.sort(key=lambda e: (e.created_at, e.id))
    docs = [
        SearchDoc(
            fragment=e.injected(),
            created_at=e.created_at,
            strengthen_count=e.strengthen_count,
            notes=tuple(e.notes),
        )
        for e in entries
    ]
    blobs = [base64.b64decode(e.vector) if e.vector else b"" for e in entries]
    vectors = None
    if blobs and all(blobs) and len({len(b) for b in blobs}) == 1:
        matrix = np.frombuffer(b"".join(blobs), dtype="<f2").astype(np.float32)
        matrix = matrix.reshape(len(blobs), -1)
        vectors = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    index = SearchIndex(docs, vectors, version)
    _ = index.bm25, index.line_bm25  # built here, in the builder's thread, not by a search
    return index


class FragmentSearch:
    """Search one user's fragments for a question: Redis corpus + in-process index + embedding."""

    def __init__(
        self,
        redis: aioredis.Redis,
        prefix: str,
        embeddings: Embeddings | None = None,
        *,
        timeout_s: float = 2.0,
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        self.embeddings = embeddings
        self.timeout_s = timeout_s
        self._indexes: OrderedDict[str, tuple[int, SearchIndex]] = OrderedDict()

    def warm(self) -> None:
        """Load the embedding model now (the first encode otherwise takes ~1.5 s)."""
        if self.embeddings is not None:
            self.embeddings.embed_query("warm up")

    async def index(self, user_id: str) -> SearchIndex:
        """The user's index, rebuilt only when the corpus version moved."""
        async with asyncio.timeout(self.timeout_s):
            version = corpus_version(await self.redis.get(corpus_version_key(self.prefix, user_id)))
            cached = self._indexes.get(user_id)
            if cached is not None and cached[0] == version:
                self._indexes.move_to_end(user_id)
                return cached[1]
            raw = await self.redis.hgetall(corpus_key(self.prefix, user_id))  # type: ignore[misc]
        index = await asyncio.to_thread(build_index, raw, version)
        self._indexes[user_id] = (version, index)
        self._indexes.move_to_end(user_id)
        while len(self._indexes) > MAX_CACHED_USERS:
            self._indexes.popitem(last=False)
        return index

    def drop(self, user_id: str) -> None:
        """Drop the user's cached index (after a forget); the next search reads the corpus."""
        self._indexes.pop(user_id, None)

    async def version(self, user_id: str) -> int:
        """The user's corpus version (0: none)."""
        return corpus_version(await self.redis.get(corpus_version_key(self.prefix, user_id)))

    async def themed_entries(self, user_id: str, theme_prefix: str) -> list[CorpusEntry]:
        """The user's fragments whose theme starts with `theme_prefix` (the LangGraph store's
        items, middleware/store.py), read from the corpus."""
        raw = await self.redis.hgetall(corpus_key(self.prefix, user_id))  # type: ignore[misc]
        entries = []
        for value in raw.values():
            try:
                entry = CorpusEntry.model_validate_json(value)
            except ValidationError:
                log.warning("unreadable corpus entry skipped")
                continue
            if entry.theme.startswith(theme_prefix):
                entries.append(entry)
        return entries

    async def _embed(self, query: str) -> Sequence[float] | None:
        if self.embeddings is None:
            return None
        return await asyncio.to_thread(self.embeddings.embed_query, query)

    async def search(
        self,
        user_id: str,
        query: str,
        config: MemoryConfig,
        now: float,
        *,
        profile: UserProfile | None = None,
        exclude: Callable[[ContextFragment], bool] | None = None,
    ) -> list[ContextFragment]:
        """Excerpts of the user's fragments for `query`, most relevant first, filling the memory
        budget (`SearchIndex.excerpts`; errors propagate, the caller falls back). `profile`
        (the one the model call is expected to inject) and `exclude` (fragments expected in
        the model's window) let the first pass fill the budget as the model call will pack it,
        so it rarely has to be asked again (`Excerpts.again`, on the event loop)."""
        index, vector = await asyncio.gather(self.index(user_id), self._embed(query))
        return await asyncio.to_thread(
            index.excerpts, query, vector, config, now, profile=profile, exclude=exclude
        )


class PendingSearches:
    """Searches started early in a turn, awaited by its model calls with a deadline.

    One per (user, thread): a new question replaces the pending search of the old one. A model
    call waits for what is left of `deadline_s` since the search started; on timeout or failure
    it gets None (the caller then uses the published context) and the search is left to finish
    for the turn's later model calls.
    """

    def __init__(self, max_entries: int = 10_000) -> None:
        self.max_entries = max_entries
        self._pending: OrderedDict[
            tuple[str, str], tuple[str, float, asyncio.Task[list[ContextFragment] | None]]
        ] = OrderedDict()

    def start(self, key: tuple[str, str], query: str, work: Callable[[], Awaitable[Found]]) -> None:
        """Start `work()` for `query` unless the same query is already pending for `key`."""
        current = self._pending.get(key)
        if current is not None and current[0] == query:
            return
        task: asyncio.Task[Found] = asyncio.ensure_future(work())
        task.add_done_callback(_retrieve)
        self._pending[key] = (query, time.monotonic(), task)
        self._pending.move_to_end(key)
        while len(self._pending) > self.max_entries:
            _, (_, _, old) = self._pending.popitem(last=False)
            old.cancel()

    async def result(
        self,
        key: tuple[str, str],
        query: str,
        deadline_s: float,
        work: Callable[[], Awaitable[Found]],
    ) -> list[ContextFragment] | None:
        """The fragments found for `query` (starting the search if needed), or None."""
        self.start(key, query, work)
        _, started, task = self._pending[key]
        remaining = deadline_s - (time.monotonic() - started)
        if not task.done():
            await asyncio.wait([task], timeout=max(0.0, remaining))
        if not task.done():
            log.info(
                "memory search missed its %.0f ms deadline; published context used",
                1e3 * deadline_s,
            )
            return None
        if task.cancelled() or task.exception() is not None:
            return None
        return task.result()

    def forget(self, key: tuple[str, str]) -> None:
        """Drop the turn's search (after the turn)."""
        entry = self._pending.pop(key, None)
        if entry is not None and not entry[2].done():
            entry[2].cancel()

    def drop_user(self, user_id: str) -> None:
        """Drop every search of the user, finished or not (after a forget: what they found may
        hold a forgotten fragment); the next model call searches again."""
        for key in [k for k in self._pending if k[0] == user_id]:
            self.forget(key)


Found = list[ContextFragment] | None


def _retrieve(task: asyncio.Task[Any]) -> None:
    # Read the outcome so an unawaited failure is logged once here, not as "never retrieved".
    if not task.cancelled() and task.exception() is not None:
        log.warning("memory search failed (the turn went on): %r", task.exception())
