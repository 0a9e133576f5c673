"""The per-call search asks Milvus only after the user's corpus version is read (README.md, "How
memory is chosen for a call"): the version is what a model call compares with the one it reads
itself, so a forget that overtakes the search shows. The version's Redis read runs while the
question is embedded; a slow or failing read still comes first."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding

from mnemoflow.memory.search import CandidateIndex
from mnemoflow.middleware.milvus_search import MilvusSearch
from mnemoflow.models.config import MemoryConfig


class Recorded(MilvusSearch):
    """Redis answers after `delay_s` (or fails); Milvus is not reached, its call recorded."""

    def __init__(self, delay_s: float, fail: bool = False) -> None:
        super().__init__("http://127.0.0.1:1", embeddings=DeterministicFakeEmbedding(size=16))
        self.delay_s = delay_s
        self.fail = fail
        self.events: list[tuple[str, object]] = []
        self.asked = asyncio.Event()

    async def _version(self, user_id: str) -> int:
        self.events.append(("version asked", user_id))
        self.asked.set()
        await asyncio.sleep(self.delay_s)  # a slow Redis
        if self.fail:
            raise ConnectionError("redis went away")
        self.events.append(("version read", 7))
        return 7

    def candidates(
        self, user_id: str, query: str, vector: Sequence[float] | None, version: int = 0
    ) -> CandidateIndex:
        self.events.append(("milvus asked", (version, vector is not None)))
        return CandidateIndex([], {}, {}, version)


@pytest.mark.parametrize("delay_s", [0.0, 0.2])
async def test_milvus_is_asked_after_the_version_is_read(delay_s: float) -> None:
    search = Recorded(delay_s)
    found = await search.search("ann", "what did I plant?", MemoryConfig(), 1_000.0)
    assert found == []
    assert [name for name, _ in search.events] == ["version asked", "version read", "milvus asked"]
    assert search.events[-1][1] == (7, True)  # the version read, and the question's vector


async def test_a_failing_version_read_fails_the_search_before_milvus() -> None:
    search = Recorded(0.05, fail=True)
    with pytest.raises(ConnectionError):
        await search.search("ann", "what did I plant?", MemoryConfig(), 1_000.0)
    assert [name for name, _ in search.events] == ["version asked"]


async def test_a_cancelled_search_leaves_no_read_behind() -> None:
    search = Recorded(5.0)
    task = asyncio.ensure_future(search.search("ann", "q", MemoryConfig(), 1_000.0))
    await asyncio.wait_for(search.asked.wait(), timeout=5.0)  # the read has started
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    pending = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.wait_for(asyncio.gather(*pending, return_exceptions=True), timeout=2.0)
    assert [name for name, _ in search.events] == ["version asked"]
