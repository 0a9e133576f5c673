"""FragmentStore against a real Milvus Lite server: idempotency, isolation, reinforcement."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from pymilvus import MilvusException

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_rows import CONTENT_MAX_BYTES
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.devstack.processes import free_port, start_milvus_lite
from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.fragments import Fragment, LineNote
from mnemoflow.models.ids import MAX_USER_ID_CHARS, fragment_id

pytestmark = pytest.mark.integration

NOW = 1_700_000_000.0
CRAFTED_USERS = [
    "alice",
    'x" or user_key != "',
    "back\\slash\\\" 'quote'",
    "用户/ünïcødé/😀",
    "u" * MAX_USER_ID_CHARS,
]
WEIRD_IDS = ['a"b', "a\\b", "' or 1==1 or pk == '", "ид-😀", "x" * 1200, "", "a b"]


def frag(user: str, index: int, content: str, *, round_no: int = 1, **extra: object) -> Fragment:
    """A fragment with a business-id primary key."""
    values: dict[str, object] = {
        "id": fragment_id(user, round_no, index),
        "user_id": user,
        "theme": "orders",
        "types": ["fact"],
        "content": content,
        "created_at": NOW + index,
        "reinforced_at": NOW + index,
        "round_no": round_no,
        "thread_id": "thread-1",
        "start_pos": index,
        "end_pos": index + 1,
    }
    values.update(extra)
    return Fragment.model_validate(values)


@pytest.fixture
async def store(milvus_uri: str, unique_name: str) -> AsyncIterator[FragmentStore]:
    """A store on a collection of its own, dropped afterwards."""
    s = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    await s.ensure()
    try:
        yield s
    finally:
        await s.drop()
        await s.close()


async def test_upsert_same_ids_twice_keeps_one_row_each(store: FragmentStore) -> None:
    first = [frag("alice", i, f"order {i} shipped") for i in range(3)]
    assert await store.upsert(first) == [f.id for f in first]
    again = [f.model_copy(update={"content": f"order {i} delivered"}) for i, f in enumerate(first)]
    await store.upsert(again)
    await store.upsert(again + again)  # a duplicated batch, as a retried activity might send

    assert await store.count("alice") == 3
    rows = await store.all_for_user("alice")
    assert [r.id for r in rows] == [f.id for f in first]
    assert [r.content for r in rows] == [f"order {i} delivered" for i in range(3)]


async def test_round_trip_keeps_every_field(store: FragmentStore) -> None:
    original = frag(
        "alice",
        0,
        "我的订单号是 A-123",
        types=["identity", "fact"],
        explicit=True,
        strengthen_count=4,
        thread_id='t/ü"1',
    )
    await store.upsert([original])
    assert await store.get("alice", [original.id]) == [original]


async def test_users_are_isolated_even_with_crafted_ids(store: FragmentStore) -> None:
    for n, user in enumerate(CRAFTED_USERS):
        await store.upsert([frag(user, i, f"{user[:20]} likes tea {i}") for i in range(n + 1)])

    for n, user in enumerate(CRAFTED_USERS):
        own = {fragment_id(user, 1, i) for i in range(n + 1)}
        assert await store.count(user) == n + 1
        assert {f.id for f in await store.all_for_user(user)} == own
        assert {c.fragment.id for c in await store.candidates(user, "tea", None)} == own
        found = await store.candidates(user, "tea", 50)
        assert {c.fragment.id for c in found} == own
        assert all(c.fragment.user_id == user for c in found)
        others = [fragment_id(u, 1, 0) for u in CRAFTED_USERS if u != user]
        assert await store.get(user, others) == []
        assert await store.reinforce(user, others, "call-x", NOW) == 0


async def test_unknown_user_sees_nothing(store: FragmentStore) -> None:
    await store.upsert([frag("alice", 0, "secret")])
    assert await store.count("mallory") == 0
    assert await store.candidates("mallory", "secret", None) == []
    assert await store.candidates("mallory", "secret", 5) == []


async def test_weird_fragment_ids_are_ignored_on_read_and_rejected_on_write(
    store: FragmentStore,
) -> None:
    await store.upsert([frag("alice", 0, "kept")])
    assert await store.get("alice", WEIRD_IDS) == []
    assert await store.reinforce("alice", WEIRD_IDS, "call-1", NOW) == 0
    for bad in WEIRD_IDS:
        with pytest.raises(InvalidInputError):
            await store.upsert([frag("alice", 0, "x").model_copy(update={"id": bad})])
    assert await store.count("alice") == 1


@pytest.mark.parametrize("bad_user", ["", "   ", "a\x00b", "u" * (MAX_USER_ID_CHARS + 1)])
async def test_unusable_user_ids_are_invalid_input(store: FragmentStore, bad_user: str) -> None:
    with pytest.raises(InvalidInputError):
        await store.count(bad_user)
    with pytest.raises(InvalidInputError):
        await store.candidates(bad_user, "q", None)


async def test_candidates_none_scores_all_of_the_users_fragments(store: FragmentStore) -> None:
    texts = [f"note {i} about topic {i % 7}" for i in range(40)]
    await store.upsert([frag("alice", i, t) for i, t in enumerate(texts)])
    await store.upsert([frag("bob", 0, "note 3 about topic 3")])

    every = await store.candidates("alice", "note 3 about topic 3", None)
    assert len(every) == 40
    assert every[0].fragment.content == "note 3 about topic 3"
    assert every[0].cos == pytest.approx(1.0, abs=1e-5)
    assert [c.cos for c in every] == sorted((c.cos for c in every), reverse=True)

    emb = HashingEmbeddings()
    q = np.asarray(emb.embed_query("note 3 about topic 3"))
    expected = {
        fragment_id("alice", 1, i): float(np.dot(q, emb.embed_query(t)))
        for i, t in enumerate(texts)
    }
    for cand in every:
        assert cand.cos == pytest.approx(expected[cand.fragment.id], abs=1e-5)

    top = await store.candidates("alice", "note 3 about topic 3", 5)
    assert len(top) == 5
    assert top[0].fragment.id == every[0].fragment.id
    for cand in top:
        assert cand.cos == pytest.approx(expected[cand.fragment.id], abs=1e-4)


async def test_bounded_candidates_keep_far_floor_types_and_read_all_of_a_small_user(
    store: FragmentStore,
) -> None:
    # 60 fragments about orders, each distinct; one identity and one preference fragment far
    # from the question; a second user's identity fragment that must never come back.
    texts = [f"order KX-{i} ships from warehouse {i * 7} on day {i % 13}" for i in range(60)]
    far = {
        60: ("identity", "my name is Ilse Vandermeer and I teach cello"),
        61: ("preference", "I prefer oat milk in every coffee"),
    }
    rows = [frag("alice", i, t) for i, t in enumerate(texts)]
    rows += [frag("alice", i, text, types=[kind]) for i, (kind, text) in far.items()]
    rows.append(frag("bob", 0, "my name is Bob", types=["identity"]))
    await store.upsert(rows)
    query = "where does order KX-12 ship from?"
    floor = ("identity", "preference")

    everything = await store.candidates("alice", query, None)
    assert len(everything) == 62
    far_ids = {fragment_id("alice", 1, i) for i in far}
    assert not far_ids & {c.fragment.id for c in everything[:12]}

    bounded = await store.candidates("alice", query, 10, floor)
    ids = [c.fragment.id for c in bounded]
    assert len(ids) == len(set(ids)) == 12  # the 10 nearest, then both floor fragments
    assert far_ids <= set(ids)
    # The nearest ten by cosine (ties at the tenth may come back in either order).
    near_cos = sorted((c.cos for c in bounded if c.fragment.id not in far_ids), reverse=True)
    assert near_cos == pytest.approx([c.cos for c in everything[:10]], abs=1e-4)
    assert [c.cos for c in bounded] == sorted((c.cos for c in bounded), reverse=True)
    exact = {c.fragment.id: c.cos for c in everything}
    for cand in bounded:
        assert cand.fragment.user_id == "alice"
        assert cand.cos == pytest.approx(exact[cand.fragment.id], abs=1e-4)
    # Without floor types (or with only unquotable ones) the bound is the bound.
    assert len(await store.candidates("alice", query, 10)) == 10
    assert len(await store.candidates("alice", query, 10, ['x"] or true or ["'])) == 10

    # A round's store step names the fragments it holds instead (published last, its own):
    # those are scored, read by id, and no floor search runs; another user's id finds nothing.
    identity, bobs = fragment_id("alice", 1, 60), fragment_id("bob", 1, 0)
    held = await store.candidates("alice", query, 10, floor, [identity, bobs, "bad id"])
    assert len(held) == 11 and identity in {c.fragment.id for c in held}
    assert all(c.fragment.user_id == "alice" for c in held)
    assert {c.fragment.id: c.cos for c in held}[identity] == pytest.approx(
        exact[identity], abs=1e-6
    )
    # A user with fewer fragments than the bound gets all of them, with no floor search.
    small = await store.candidates("alice", query, 256, floor)
    assert {c.fragment.id for c in small} == set(exact)


class CountingEmbeddings(HashingEmbeddings):
    """The hashing embedder, counting its calls; `symmetric` as asked."""

    def __init__(self, symmetric: bool) -> None:
        super().__init__()
        self.symmetric = symmetric
        self.calls: list[tuple[str, int]] = []

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls.append(("documents", len(texts)))
        return super().embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        self.calls.append(("query", 1))
        return super().embed_query(text)


@pytest.mark.parametrize("symmetric", [True, False])
async def test_a_round_s_query_rides_in_its_fragments_forward_pass(
    milvus_uri: str, unique_name: str, symmetric: bool
) -> None:
    """One embedding call for a store step's fragments and its selection query, when the
    embedder embeds queries and documents alike; the same cosines either way."""
    emb = CountingEmbeddings(symmetric)
    s = FragmentStore(milvus_uri, emb, collection=f"{unique_name}_{int(symmetric)}")
    await s.ensure()
    try:
        texts = [f"booking {i}: a table for {i + 2} at the harbour cafe" for i in range(5)]
        query = "which table did I book at the harbour cafe?"
        await s.upsert_vectors([frag("ada", i, t) for i, t in enumerate(texts)], query=query)
        found = await s.candidates("ada", query, None)
        if symmetric:
            assert emb.calls == [("documents", 6)]
        else:
            assert emb.calls == [("documents", 5), ("query", 1)]
        q = np.asarray(HashingEmbeddings().embed_query(query))
        for cand in found:
            want = float(np.dot(q, HashingEmbeddings().embed_query(cand.fragment.content)))
            assert cand.cos == pytest.approx(want, abs=1e-5)
        assert len(found) == 5
        # The vector is kept by text: the same query again costs no call, another one does.
        await s.candidates("ada", query, 3)
        await s.candidates("ada", "and the harbour cafe's phone?", None)
        assert emb.calls[-1] == ("query", 1) and len(emb.calls) == (2 if symmetric else 3)
        # A long query is embedded each time, never kept (the kept keys stay small).
        long = "harbour " * 1000
        await s.candidates("ada", long, None)
        await s.candidates("ada", long, None)
        assert emb.calls[-2:] == [("query", 1), ("query", 1)] and long not in s._query_vectors
    finally:
        await s.drop()
        await s.close()


async def test_reinforce_applies_once_per_call_id(store: FragmentStore) -> None:
    frags = [frag("alice", i, f"fact {i}") for i in range(3)]
    await store.upsert(frags)
    ids = [frags[0].id, frags[1].id, frags[1].id]

    assert await store.reinforce("alice", ids, "call-1", NOW + 100) == 2
    assert await store.reinforce("alice", ids, "call-1", NOW + 200) == 0  # a retried activity
    after = {f.id: f for f in await store.all_for_user("alice")}
    assert after[frags[0].id].strengthen_count == 1
    assert after[frags[0].id].reinforced_at == NOW + 100
    assert after[frags[2].id].strengthen_count == 0

    assert await store.reinforce("alice", ids, "call-2", NOW + 300) == 2
    after = {f.id: f for f in await store.all_for_user("alice")}
    assert after[frags[1].id].strengthen_count == 2
    assert after[frags[1].id].reinforced_at == NOW + 300
    assert after[frags[1].id].content == "fact 1"
    # The vector survived the rewrite: the fragment is still its own best match.
    best = await store.candidates("alice", "fact 1", 1)
    assert best[0].fragment.id == frags[1].id


async def test_delete_user_removes_only_that_user(store: FragmentStore) -> None:
    await store.upsert([frag("alice", i, f"a{i}") for i in range(4)])
    await store.upsert([frag(CRAFTED_USERS[1], 0, "crafted")])

    assert await store.delete_user("alice") == 4
    assert await store.count("alice") == 0
    assert await store.candidates("alice", "a1", None) == []
    assert await store.count(CRAFTED_USERS[1]) == 1
    assert await store.delete_user("alice") == 0


async def test_oversized_content_is_trimmed_on_a_character_boundary(
    store: FragmentStore,
) -> None:
    huge = "长" * 30_000  # 90,000 UTF-8 bytes
    await store.upsert([frag("alice", 0, huge)])
    [stored] = await store.get("alice", [fragment_id("alice", 1, 0)])
    assert len(stored.content.encode("utf-8")) <= CONTENT_MAX_BYTES
    assert stored.content == "长" * (CONTENT_MAX_BYTES // 3)


async def test_reopen_and_dimension_mismatch(store: FragmentStore, milvus_uri: str) -> None:
    await store.upsert([frag("alice", 0, "durable")])
    reopened = FragmentStore(milvus_uri, HashingEmbeddings(), collection=store.collection)
    await reopened.ensure()  # existing collection: no error, same rows
    assert [f.content for f in await reopened.all_for_user("alice")] == ["durable"]
    await reopened.close()

    wrong = FragmentStore(milvus_uri, HashingEmbeddings(dim=64), collection=store.collection)
    with pytest.raises(ValueError, match="64"):
        await wrong.ensure()
    await wrong.close()


async def test_store_recovers_after_a_milvus_lite_restart(tmp_path: Path) -> None:
    """Down: attempts fail fast (Temporal retries). Back up: the next attempts succeed, even
    though a restarted Milvus Lite brings the collection back released."""
    port = free_port()
    proc = start_milvus_lite(port, tmp_path)
    store = FragmentStore(f"http://127.0.0.1:{port}", HashingEmbeddings(), collection="c")
    try:
        await store.ensure()
        await store.upsert([frag("alice", 0, "survives restarts")])
        proc.stop()
        with pytest.raises(MilvusException):
            await store.count("alice")
        proc = start_milvus_lite(port, tmp_path)
        # Retry the way Temporal would (1 s initial interval): gRPC holds a refused address in
        # reconnect backoff for about a second, so back-to-back attempts would only measure that.
        attempts, deadline = 0, time.monotonic() + 20
        while True:
            attempts += 1
            try:
                assert await store.count("alice") == 1
                break
            except MilvusException:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
        assert attempts <= 4
        [cand] = await store.candidates("alice", "survives restarts", None)
        assert cand.fragment.content == "survives restarts"
    finally:
        await store.close()
        proc.stop()


def _count_flushes(store: FragmentStore) -> list[str]:
    """Wrap the store's client so every flush it makes is recorded."""
    client = store._connected()
    flush = client.flush
    made: list[str] = []

    def counted(collection: str, **kwargs: object) -> object:
        made.append(collection)
        return flush(collection, **kwargs)

    client.flush = counted  # type: ignore[method-assign]
    return made


async def test_flush_once_the_rows_written_reach_flush_rows(
    milvus_uri: str, unique_name: str
) -> None:
    """Writes flush once `flush_rows` rows are unflushed, reads see unflushed rows, and a delete
    flushes at once (a forget must not leave rows in the memtable)."""
    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name, flush_rows=8)
    await store.ensure()
    try:
        made = _count_flushes(store)
        await store.upsert([frag("alice", i, f"first batch line {i}") for i in range(4)])
        assert made == []
        assert await store.count("alice") == 4  # unflushed rows are read like any other
        assert len(await store.candidates("alice", "first batch line 2", None)) == 4
        await store.upsert([frag("alice", i, f"second batch line {i}") for i in range(4, 8)])
        assert len(made) == 1
        ids = [fragment_id("alice", 1, i) for i in (0, 1)]
        assert await store.reinforce("alice", ids, "call-1", NOW + 100) == 2
        assert len(made) == 1  # 2 rows unflushed since
        assert await store.delete("alice", [fragment_id("alice", 1, 7)]) == 1
        assert len(made) == 2
        assert await store.count("alice") == 7
        assert await store.delete_user("alice") == 7
        assert len(made) == 3
    finally:
        await store.drop()
        await store.close()


async def test_a_flush_on_lite_warms_both_collections_and_a_failed_warm_up_loses_nothing(
    milvus_uri: str, unique_name: str
) -> None:
    """After a flush on Milvus Lite the store searches each index once (the fragments' vectors,
    the lines' BM25), so that an agent's next search does not build the flushed
    segments' indexes; no flush, no warm-up; a warm-up that fails leaves the write done."""
    store = FragmentStore(
        milvus_uri, HashingEmbeddings(), collection=unique_name, flush_rows=8, lines=True
    )
    await store.ensure()
    try:
        client = store._connected()
        search = client.search
        made: list[tuple[str, str]] = []
        failing = False

        def spied(collection: str, **kwargs: object) -> object:
            made.append((collection, str(kwargs.get("anns_field"))))
            if failing:
                raise MilvusException(message="warm-up refused (test)")
            return search(collection, **kwargs)

        client.search = spied  # type: ignore[method-assign]
        warmed = FragmentStore.warmups_total
        await store.upsert([frag("alice", i, f"first batch line {i}") for i in range(4)])
        assert made == [] and FragmentStore.warmups_total == warmed  # 4 rows: no flush yet
        await store.upsert([frag("alice", i, f"second batch line {i}") for i in range(4, 8)])
        lines = store.lines_collection
        assert made == [(unique_name, "vector"), (lines, "sparse")]
        assert FragmentStore.warmups_total == warmed + 1
        made.clear()
        failing = True
        await store.upsert([frag("bob", i, f"bob says line {i}") for i in range(8)])
        assert made == [(unique_name, "vector")]  # the first warm-up search failed, no more
        assert FragmentStore.warmups_total == warmed + 1
        failing = False
        assert await store.count("bob") == 8  # the write and its flush stand
        assert len(await store.candidates("bob", "bob says line 3", None)) == 8
    finally:
        await store.drop()
        await store.close()


@pytest.mark.parametrize(("flush_rows", "expected"), [(1, 3), (0, 0)])
async def test_flush_rows_one_flushes_every_write_and_zero_never(
    milvus_uri: str, unique_name: str, flush_rows: int, expected: int
) -> None:
    store = FragmentStore(
        milvus_uri, HashingEmbeddings(), collection=unique_name, flush_rows=flush_rows
    )
    await store.ensure()
    try:
        made = _count_flushes(store)
        await store.upsert([frag("bob", 0, "one")])
        await store.upsert([frag("bob", 1, "two")])
        await store.delete("bob", [fragment_id("bob", 1, 0)])
        assert len(made) == expected
        assert [f.content for f in await store.all_for_user("bob")] == ["two"]
    finally:
        await store.drop()
        await store.close()


def test_flush_rows_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="flush_rows"):
        FragmentStore("http://127.0.0.1:1", HashingEmbeddings(), flush_rows=-1)


async def test_unflushed_rows_and_deletes_survive_a_milvus_lite_sigkill(tmp_path: Path) -> None:
    """The flush policy rests on this: what was written but not flushed is durable already."""
    port = free_port()
    proc = start_milvus_lite(port, tmp_path)
    store = FragmentStore(
        f"http://127.0.0.1:{port}", HashingEmbeddings(), collection="c", flush_rows=0
    )
    try:
        await store.ensure()
        await store.upsert([frag("carol", i, f"unflushed line {i}") for i in range(10)])
        assert await store.delete("carol", [fragment_id("carol", 1, i) for i in (3, 7)]) == 2
        proc.popen.kill()  # SIGKILL: no chance to flush on the way out
        proc.popen.wait(timeout=30)
        proc.stop()
        proc = start_milvus_lite(port, tmp_path)
        deadline = time.monotonic() + 30
        while True:  # the client reconnects after gRPC's backoff (see the restart test)
            try:
                kept = await store.all_for_user("carol")
                break
            except MilvusException:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)
        assert sorted(f.content for f in kept) == sorted(
            f"unflushed line {i}" for i in range(10) if i not in (3, 7)
        )
    finally:
        await store.close()
        proc.stop()


async def test_all_for_user_past_the_query_window_reads_every_row_of_that_user_only(
    store: FragmentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past Milvus's result window the rows come from an iterator, with the same options (the
    user's bucket, strong consistency) as a single query: every row of the user, none of
    another's, each distinct."""
    from mnemoflow.activities import fragment_collection

    monkeypatch.setattr(fragment_collection, "QUERY_WINDOW", 7)
    mine = [frag("iter-a", i, f"line {i} of user a, token {i * 37}") for i in range(23)]
    theirs = [frag("iter-b", i, f"line {i} of user b, token {i * 41}") for i in range(5)]
    await store.upsert(mine + theirs)
    got = await store.all_for_user("iter-a")
    assert sorted(f.content for f in got) == sorted(f.content for f in mine)
    assert len({f.id for f in got}) == 23


async def test_notes_round_trip_and_survive_a_reinforce(store: FragmentStore) -> None:
    notes = [
        LineNote(when="yesterday = 7 May 2023", terms="8 May 2023 | 7 May 2023 | Ana | 支持"),
        LineNote(),
    ]
    original = frag("alice", 0, "User: I went yesterday.\nAssistant: Nice.", notes=notes)
    await store.upsert([original])
    assert (await store.get("alice", [original.id]))[0].notes == notes
    assert await store.reinforce("alice", [original.id], "call-1", NOW + 5) == 1
    (reinforced,) = await store.all_for_user("alice")
    assert reinforced.notes == notes and reinforced.strengthen_count == 1


async def test_a_collection_made_before_the_notes_keeps_working(
    milvus_uri: str, unique_name: str
) -> None:
    """Milvus Lite cannot add a column to an existing collection: rows of a collection created
    before the notes are written and read without them, and those written before read alike."""
    from pymilvus import MilvusClient

    from mnemoflow.activities.fragment_collection import build_schema, index_params
    from mnemoflow.activities.fragment_rows import NOTES_FIELD, to_row

    client = MilvusClient(milvus_uri)
    old = build_schema(HashingEmbeddings().dim)
    old.fields[:] = [f for f in old.fields if f.name != NOTES_FIELD]  # the schema before
    client.create_collection(unique_name, schema=old, index_params=index_params("HNSW"))
    before = frag("alice", 0, "User: stored before the notes")
    vector = HashingEmbeddings().embed_documents([before.content])[0]
    client.insert(unique_name, [to_row(before, vector)])
    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    try:
        await store.ensure()
        after = frag("alice", 1, "User: yesterday, after", notes=[LineNote(when="x", terms="y")])
        await store.upsert([after])
        rows = await store.all_for_user("alice")
        assert [(r.content, r.notes) for r in rows] == [(before.content, []), (after.content, [])]
        assert await store.reinforce("alice", [before.id, after.id], "c", NOW + 9) == 2
    finally:
        await store.drop()
        await store.close()
        client.close()
