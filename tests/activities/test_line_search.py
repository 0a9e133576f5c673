"""The per-call search served by Milvus, against a real Milvus Lite server: the worker's
`FragmentStore(lines=True)` writes, the agent's `MilvusSearch` reads (README.md, "How memory is
chosen for a call").

The tokenisation tests search lexically only (the test hashing embedder shares character
trigrams, which would find the line by themselves): the question's words meet the line's only
through the project's own tokenisation (stemming, Chinese bigrams), which the worker wrote as
analysed terms. With the raw text in the BM25 field instead, both fail.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

import mnemoflow.middleware.milvus_search as milvus_search
from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.middleware.milvus_search import MilvusSearch
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.corpus import corpus_version, corpus_version_key, forgotten_since
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import fragment_id, user_key

pytestmark = pytest.mark.integration

NOW = time.time()
#: Room for about one window of lines: what is found must rank first, not merely be among the
#: candidates (a user with forty lines has every line among them).
CONFIG = MemoryConfig(memory_budget_tokens=90)
FILLER = [
    "User: we talked about the weather at the coast today",
    "Assistant: the forecast says rain all week",
    "User: the train was late again this morning",
    "Assistant: that sounds tiring",
]


def frag(
    user: str, round_no: int, lines: list[str], *, thread: str = "t1", start: int = 0
) -> Fragment:
    return Fragment(
        id=fragment_id(user, round_no, 0),
        user_id=user,
        theme="general",
        types=["chat"],
        content="\n".join(lines),
        created_at=NOW - 86400 * (30 - round_no),
        reinforced_at=NOW - 86400 * (30 - round_no),
        round_no=round_no,
        thread_id=thread,
        start_pos=start,
        end_pos=start + len(lines),
    )


@pytest.fixture
async def store(milvus_uri: str, unique_name: str) -> AsyncIterator[FragmentStore]:
    s = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name, lines=True)
    await s.ensure()
    try:
        yield s
    finally:
        await s.drop()
        if s.lines_collection is not None:
            name = s.lines_collection
            await s._run_write(lambda c: c.drop_collection(name))
        await s.close()


@pytest.fixture
async def searcher(milvus_uri: str, store: FragmentStore) -> AsyncIterator[MilvusSearch]:
    s = MilvusSearch(milvus_uri, collection=store.collection, embeddings=HashingEmbeddings())
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def lexical(milvus_uri: str, store: FragmentStore) -> AsyncIterator[MilvusSearch]:
    s = MilvusSearch(milvus_uri, collection=store.collection)
    try:
        yield s
    finally:
        await s.close()


async def _text(searcher: MilvusSearch, user: str, query: str) -> str:
    found = await searcher.search(user, query, CONFIG, NOW)
    return "\n".join(f.content for f in found)


async def _history(store: FragmentStore, user: str, detail: str) -> None:
    """Ten rounds of filler with the detail in the third."""
    for r in range(1, 11):
        lines = list(FILLER)
        if r == 3:
            lines[2] = detail
        await store.upsert([frag(user, r, lines, thread=f"s{r}")])


async def test_english_needs_the_stemming_the_worker_wrote(
    store: FragmentStore, lexical: MilvusSearch
) -> None:
    searcher = lexical
    detail = "User: my daughter is playing the violins on Saturdays"
    await _history(store, "ann", detail)
    assert detail in await _text(searcher, "ann", "Who plays violin each Saturday?")
    # another user's memory is never a candidate
    await _history(store, "bob", "User: bob's cat is called Pixel")
    assert "Pixel" not in await _text(searcher, "ann", "what is the cat called")
    assert "Pixel" in await _text(searcher, "bob", "what is the cat called")


async def test_chinese_needs_the_bigrams_the_worker_wrote(
    store: FragmentStore, lexical: MilvusSearch
) -> None:
    searcher = lexical
    detail = "User: 我女儿在学小提琴，每周六上课"
    await _history(store, "李雷", detail)
    # no space in either: Lite's standard analyzer alone would see one word each
    assert detail in await _text(searcher, "李雷", "小提琴课是哪天？")


async def test_the_window_crosses_into_the_next_fragment_of_the_thread(
    store: FragmentStore, searcher: MilvusSearch
) -> None:
    first = ["User: filler one", "Assistant: filler two", "User: my sister Mia moved to Lisbon"]
    after = ["Assistant: Lisbon is lovely in spring", "User: she loves it"]
    await store.upsert([frag("cy", 1, first, thread="th", start=0)])
    await store.upsert([frag("cy", 2, after, thread="th", start=3)])
    await store.upsert([frag("cy", 3, FILLER, thread="other", start=0)])
    found = await searcher.search("cy", "Where did Mia move?", CONFIG, NOW)
    by_id = {f.id: f.content for f in found}
    assert first[2] in by_id[fragment_id("cy", 1, 0)]
    # the next turn, in the next fragment of the thread (a candidate too, by its vector)
    assert after[0] in by_id[fragment_id("cy", 2, 0)]


async def test_a_fragment_stored_again_keeps_only_its_new_lines(
    store: FragmentStore, searcher: MilvusSearch
) -> None:
    secret = "User: my locker code is 4471 at the gym"
    await store.upsert([frag("dee", 1, [*FILLER[:2], secret, FILLER[3]])])
    assert secret in await _text(searcher, "dee", "locker code gym")
    # a forget of that one line rewrites the row (same id, fewer lines)
    await store.upsert([frag("dee", 1, [*FILLER[:2], FILLER[3]])])
    assert "4471" not in await _text(searcher, "dee", "locker code gym")
    assert await store._lines_left(user_key("dee"), [fragment_id("dee", 1, 0)]) == 3


async def test_forget_during_a_search_leaves_the_candidates_in_the_same_step(
    store: FragmentStore,
    milvus_uri: str,
    redis_url: str,
    unique_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker forgets a fragment (the store's delete, then the corpus version's bump) just
    after the hybrid search returned its line: the search says it read the version before the
    forget, which a model call that reads the new one takes for a delete (`forgotten_since`)
    and searches again; the search from then on finds nothing of it, in the same step."""
    redis = aioredis.Redis.from_url(redis_url)
    corpus = SearchCorpus(redis, f"{unique_name}:")
    searcher = MilvusSearch(
        milvus_uri, collection=store.collection, redis=redis, key_prefix=f"{unique_name}:"
    )
    secret = "User: my locker code is 4471 at the gym"
    await _history(store, "eve", secret)
    await corpus.added([frag("eve", 1, FILLER)])  # a version to start from
    before = corpus_version(await redis.get(corpus_version_key(f"{unique_name}:", "eve")))
    gone = fragment_id("eve", 3, 0)
    loop = asyncio.get_running_loop()
    real = milvus_search._hybrid
    seen: list[str] = []

    async def forget() -> None:
        await store.delete("eve", [gone])
        await corpus.remove("eve", [gone])

    def forget_meanwhile(*args: Any) -> Any:
        hits = real(*args)
        seen.extend(h.fragment_id for h in hits)  # it found the line
        asyncio.run_coroutine_threadsafe(forget(), loop).result(30)
        return hits

    monkeypatch.setattr(milvus_search, "_hybrid", forget_meanwhile)
    try:
        found = await searcher.search("eve", "locker code gym", CONFIG, NOW)
        after = corpus_version(await redis.get(corpus_version_key(f"{unique_name}:", "eve")))
        assert gone in seen
        read = getattr(found, "version", None)
        assert read == before != after
        assert read is not None and forgotten_since(read, after)  # the model call searches again
        monkeypatch.undo()
        # and the delete took its lines with it: the next search does not see it
        assert await store._lines_left(user_key("eve"), [gone]) == 0
        again = await searcher.search("eve", "locker code gym", CONFIG, NOW)
        assert "4471" not in "\n".join(f.content for f in again)
        assert gone not in {f.id for f in again}
        assert getattr(again, "version", None) == after
    finally:
        await searcher.close()
        await redis.aclose()


async def test_a_lost_line_delete_is_done_again_before_the_forget_returns(
    store: FragmentStore, searcher: MilvusSearch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search trusts the line rows, so a forget's delete of them that reports success but
    leaves them (Milvus Lite can lose one) is read back and done again: the forget returns only
    once no line is left, and the search never finds it."""
    secret = "User: my locker code is 4471 at the gym"
    await _history(store, "fay", secret)
    gone = fragment_id("fay", 3, 0)
    assert secret in await _text(searcher, "fay", "locker code gym")
    real = store._delete_lines
    lost: list[str] = []

    def lose_the_first(client: Any, expr: str) -> None:
        if not lost:
            lost.append(expr)  # reported done, nothing deleted
            return
        real(client, expr)

    monkeypatch.setattr(store, "_delete_lines", lose_the_first)
    assert await store.delete("fay", [gone]) == 1
    assert lost  # the first delete of its lines was lost, and done again
    assert await store._lines_left(user_key("fay"), [gone]) == 0
    assert "4471" not in await _text(searcher, "fay", "locker code gym")


async def test_lines_carry_their_fragments_strength_after_a_reinforcement(
    store: FragmentStore, searcher: MilvusSearch
) -> None:
    """Every write of a fragment writes its lines, a reinforcement too: the search ranks by the
    strength the fragment row holds, without reading it."""
    await _history(store, "ivy", "User: my locker code is 4471 at the gym")
    fid = fragment_id("ivy", 3, 0)
    assert await store.reinforce("ivy", [fid], "call-1", NOW) == 1
    assert await store.reinforce("ivy", [fid], "call-2", NOW) == 1
    key = user_key("ivy")
    index = await asyncio.to_thread(searcher.candidates, "ivy", "locker code gym", None)
    strength = {d.fragment.id: d.strengthen_count for d in index.docs}
    assert strength[fid] == 2
    others = await asyncio.to_thread(searcher.candidates, "ivy", "weather coast forecast", None)
    counts = {d.fragment.id: d.strengthen_count for d in others.docs}
    assert len(counts) == 10  # every round's filler line
    assert counts == {f: 2 if f == fid else 0 for f in counts}  # the others were not drawn on
    stored = {f.id: f.strengthen_count for f in await store.get("ivy", list(strength))}
    assert stored == strength
    assert await store._lines_left(key, [fid]) == 4  # upserted in place, none lost or added


async def test_forgetting_the_user_deletes_every_line(
    store: FragmentStore, searcher: MilvusSearch
) -> None:
    await _history(store, "gus", "User: my locker code is 4471 at the gym")
    assert await store._lines_left(user_key("gus"), None) == 40
    assert await store.delete_user("gus") == 10
    assert await store._lines_left(user_key("gus"), None) == 0
    assert await _text(searcher, "gus", "locker code gym") == ""


async def test_copies_of_a_memory_are_found_through_milvus(
    store: FragmentStore, searcher: MilvusSearch
) -> None:
    fact = "my locker code is 4471 at the gym"
    await _history(store, "hal", f"User: please remember this: {fact}")
    remembered = frag("hal", 20, [fact], thread="")
    await store.upsert([remembered])
    copies = await searcher.copies_of("hal", remembered.id, 16)
    assert copies == [fragment_id("hal", 3, 0)]


async def test_the_two_reads_rank_lines_as_one_hybrid_search_of_lines_with_vectors_did(
    store: FragmentStore, searcher: MilvusSearch
) -> None:
    """The line rows carry no vector: the dense side reads the fragment collection and each
    fragment found stands for its lines. Against a collection of the earlier layout (each line
    row with its fragment's vector, one hybrid search fused by Milvus Lite) holding the same
    lines, the fused scores are the same, line for line (lines of one fragment tie on the
    dense side, so where the cut falls among tied lines either may be kept: scores compared
    in order, lines compared where no tie is cut)."""
    from pymilvus import AnnSearchRequest, MilvusClient, WeightedRanker

    from mnemoflow.activities.line_rows import line_rows
    from mnemoflow.memory.lines import query_terms
    from tests.support.line_layouts import earlier_line_schema

    words = ["garden", "tomato", "river", "kayak", "violin", "recital", "bakery", "sourdough"]
    frags = []
    for n in range(1, 31):
        lines = [
            f"User: note {n} about the {words[n % 8]} and the {words[(n * 3) % 8]} {n * 7}",
            f"Assistant: heard, the {words[(n + 5) % 8]} matters {n}",
        ] + ([f"User: also {words[(n * 5) % 8]} plans for week {n}"] if n % 3 else [])
        frags.append(frag("ann", n, lines))
    frags.append(frag("bob", 1, ["User: the garden and the river with my violin"]))
    await store.upsert(frags)  # one write: one segment, so BM25 statistics as in the copy
    vectors = store._embeddings.embed_documents([f.content for f in frags])
    old = f"{store.collection}_layout_before"
    client = store._connected()

    def earlier_layout(c: Any) -> None:
        schema = earlier_line_schema(store.dim, fragment=True)
        index = MilvusClient.prepare_index_params()
        index.add_index("vector", index_type="FLAT", metric_type="COSINE")
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25")
        c.create_collection(old, schema=schema, index_params=index)
        rows = [
            {**row, "vector": v}
            for f, v in zip(frags, vectors, strict=True)
            for row in line_rows(f)
        ]
        c.insert(old, rows)
        c.flush(old)
        c.flush(store.collection)
        assert store.lines_collection is not None
        c.flush(store.lines_collection)

    await store._run_write(earlier_layout)
    try:
        key = user_key("ann")
        hexkey = milvus_search._hex(key)
        opts = searcher._opts(key)
        assert store.lines_collection is not None
        compared = 0
        for question in [
            "what about the garden and the tomato",
            "kayak on the river",
            "violin recital plans",
            "sourdough at the bakery week 12",
            "nothing here matches",
        ]:
            vector = searcher.embeddings.embed_query(question)  # type: ignore[union-attr]
            # 96: every line of ann's on both sides. Below 82 lines the dense side cuts
            # through a fragment, and which of its tied lines the earlier layout kept was
            # arbitrary (and then their fused scores): only the cut's size is compared there.
            for limit in (96, 20):
                expr = f'user_key == "{hexkey}"'
                before = client.hybrid_search(
                    old,
                    [
                        AnnSearchRequest(
                            data=[query_terms(question)],
                            anns_field="sparse",
                            param={"metric_type": "BM25"},
                            limit=limit,
                            expr=expr,
                        ),
                        AnnSearchRequest(
                            data=[vector],
                            anns_field="vector",
                            param={"metric_type": "COSINE"},
                            limit=min(limit, milvus_search.DENSE_LINES),
                            expr=expr,
                        ),
                    ],
                    WeightedRanker(1.0, milvus_search.FUSED_DENSE_WEIGHT),
                    limit=limit,
                    output_fields=["fragment_id", "position"],
                    consistency_level="Strong",
                )[0]
                now = milvus_search._hybrid(
                    client,
                    store.lines_collection,
                    store.collection,
                    hexkey,
                    question,
                    vector,
                    opts,
                    limit,
                )
                was = [round(float(h["distance"]), 5) for h in before]
                scores = [round(h.score, 5) for h in now]
                assert scores == sorted(scores, reverse=True) and len(now) == len(was)
                if limit < 82:
                    continue
                assert scores == was, (question, limit)
                last = was[-1] if was else None
                untied_before = {
                    (h["entity"]["fragment_id"], int(h["entity"]["position"]))
                    for h in before
                    if round(float(h["distance"]), 5) != last
                }
                untied_now = {(h.fragment_id, h.position) for h in now if round(h.score, 5) != last}
                assert untied_now == untied_before, (question, limit)
                assert all(h.fragment_id.startswith(key[:24]) for h in now)  # ann's only
                compared += len(now)
        assert compared > 350
    finally:
        await store._run_write(lambda c: c.drop_collection(old))
