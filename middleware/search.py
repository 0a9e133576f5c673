"""The agent process's side of the per-call memory search (README.md, "How memory is
chosen for a call"): the searches a turn starts early and its model calls wait for
(`PendingSearches`), and `build_index`, the in-process index over a few corpus entries (the
LangGraph store's items, middleware/store.py). The candidates of the per-call search come from
Milvus (middleware/milvus_search.py).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from pydantic import ValidationError

from mnemoflow.memory.search import SearchDoc, SearchIndex
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.corpus import CorpusEntry

log = logging.getLogger(__name__)


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
