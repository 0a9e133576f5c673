"""The agent-side pieces of the per-call search: the corpus index and the deadline on searches."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from mnemoflow.middleware.search import PendingSearches, build_index
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.corpus import CorpusEntry, decode_vector, encode_vector

KEY = ("user", "thread")
FOUND = [ContextFragment(id="f1", theme="t", types=["fact"], content="Lily plays the violin")]


def _entry(i: int, content: str, vector: list[float] | None) -> bytes:
    entry = CorpusEntry(
        id=f"f{i}",
        theme="t",
        types=["fact"],
        content=content,
        created_at=1000.0 + i,
        vector=encode_vector(vector) if vector is not None else "",
    )
    return entry.model_dump_json().encode()


def test_vectors_survive_the_float16_round_trip() -> None:
    values = [0.5, -0.25, 0.123456, 1e6, 0.0]
    decoded = decode_vector(encode_vector(values))
    assert decoded[:3] == [0.5, -0.25, decoded[2]] and abs(decoded[2] - 0.123456) < 1e-3
    assert decoded[3] == 65504.0  # clamped to float16's range
    assert decode_vector("") == []


def test_index_from_the_corpus_hash_searches_by_words_and_by_vectors() -> None:
    raw = {
        b"f1": _entry(1, "User: my daughter Lily plays the violin", [1.0, 0.0, 0.0]),
        b"f2": _entry(2, "User: the weather was grey all week", [0.0, 1.0, 0.0]),
        b"bad": b"{not json",
    }
    index = build_index(raw)
    assert [d.fragment.id for d in index.docs] == ["f1", "f2"]  # the unreadable one skipped
    assert index.vectors is not None
    config = MemoryConfig(always_inject_types=())
    assert index.search("violin", None, config, 2000.0)[0].id == "f1"
    assert index.search("instrument?", [0.0, 0.9, 0.1], config, 2000.0)[0].id == "f2"
    assert index.docs[0].fragment.created_at == 1001.0  # the date reaches the prompt


def test_index_without_vectors_for_every_entry_is_lexical() -> None:
    raw = {b"f1": _entry(1, "violin", [1.0, 0.0]), b"f2": _entry(2, "weather", None)}
    index = build_index(raw)
    assert index.vectors is None
    assert index.search("weather", [1.0, 0.0], MemoryConfig(), 2000.0)[0].id == "f2"


async def test_a_search_that_answers_in_time_is_used() -> None:
    pending = PendingSearches()

    async def work() -> list[ContextFragment] | None:
        return FOUND

    pending.start(KEY, "q", work)
    assert await pending.result(KEY, "q", 5.0, work) == FOUND


async def test_a_hanging_search_gives_none_at_its_deadline_and_serves_later_calls() -> None:
    pending = PendingSearches()
    release = asyncio.Event()

    async def work() -> list[ContextFragment] | None:
        await release.wait()  # a store that does not answer
        return FOUND

    pending.start(KEY, "q", work)
    started = time.monotonic()
    assert await pending.result(KEY, "q", 0.2, work) is None
    assert time.monotonic() - started < 2.0  # bounded by the deadline, not by the search
    release.set()
    # The same question's next model call (e.g. after a tool call) gets the finished search.
    task = pending._pending[KEY][2]
    await asyncio.wait([task], timeout=5.0)
    assert await pending.result(KEY, "q", 0.2, work) == FOUND


async def test_a_failing_search_gives_none_and_a_new_question_replaces_the_old_one() -> None:
    pending = PendingSearches()
    calls: list[str] = []

    async def broken() -> list[ContextFragment] | None:
        calls.append("broken")
        raise ConnectionError("redis is down")

    assert await pending.result(KEY, "q1", 1.0, broken) is None

    async def fine() -> list[ContextFragment] | None:
        calls.append("fine")
        return FOUND

    assert await pending.result(KEY, "q2", 1.0, fine) == FOUND
    assert calls == ["broken", "fine"]
    pending.forget(KEY)
    assert KEY not in pending._pending


async def test_dropping_a_user_searches_again_for_that_user_only() -> None:
    pending = PendingSearches()
    calls: list[tuple[str, str]] = []

    def work_for(key: tuple[str, str]) -> Callable[[], Awaitable[list[ContextFragment] | None]]:
        async def work() -> list[ContextFragment] | None:
            calls.append(key)
            return FOUND

        return work

    mine, other_thread, theirs = ("user", "t1"), ("user", "t2"), ("other", "t1")
    for key in (mine, other_thread, theirs):
        assert await pending.result(key, "q", 5.0, work_for(key)) == FOUND
    pending.drop_user("user")  # after a forget tool call in one of the user's turns
    for key in (mine, other_thread, theirs):
        await pending.result(key, "q", 5.0, work_for(key))
    assert calls == [mine, other_thread, theirs, mine, other_thread]
