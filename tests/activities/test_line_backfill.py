"""Backfill of line rows (activities/line_backfill.py) against a real Milvus Lite server:
fragments stored by a worker that wrote no lines (before the line collection) become findable
by the search served by Milvus, and a fragment forgotten or stored again while the backfill
runs never keeps lines that are not its stored ones."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

import mnemoflow.activities.line_backfill as line_backfill
from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_rows import to_row
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.line_backfill import backfill_lines
from mnemoflow.middleware.milvus_search import MilvusSearch
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.ids import user_key
from tests.activities.test_line_search import frag

pytestmark = pytest.mark.integration

NOW = time.time()
CONFIG = MemoryConfig(memory_budget_tokens=400)


@pytest.fixture
async def stores(
    milvus_uri: str, unique_name: str
) -> AsyncIterator[tuple[FragmentStore, FragmentStore]]:
    """The same collection through a store without lines (a worker from before the line collection)
    and one with them."""
    before = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    after = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name, lines=True)
    await before.ensure()
    try:
        yield before, after
    finally:
        await after.ensure()
        await after.drop()
        name = after.lines_collection
        assert name is not None
        await after._run_write(lambda c: c.drop_collection(name))
        await before.close()
        await after.close()


async def line_count(store: FragmentStore, user: str, ids: list[str] | None = None) -> int:
    return await store._lines_left(user_key(user), ids)


def history(user: str, rounds: int) -> list[Fragment]:
    """Distinct lines per user and round: each names its user, round and a word of its own."""
    return [
        frag(
            user,
            r,
            [
                f"User: {user} round {r} mentions the {word}{r} collection",
                f"Assistant: noted, {user}, the {word}{r} item from round {r}",
            ],
        )
        for r in range(1, rounds + 1)
        for word in ["zephyr"]
    ]


async def test_backfill_makes_old_fragments_findable_and_is_idempotent(
    stores: tuple[FragmentStore, FragmentStore], milvus_uri: str
) -> None:
    before, after = stores
    users = {"alice": 7, "bob": 4, "chen": 3}
    for user, rounds in users.items():
        await before.upsert(history(user, rounds))
    # One fragment already has its lines (stored by a worker with lines on): left as it is.
    fresh = frag("alice", 20, ["User: alice says the lighthouse keeper is named Ormond"])
    await after.ensure()  # a worker started with lines on
    await after.upsert([fresh])
    assert await line_count(after, "alice") == 1

    report = await backfill_lines(after, batch=4)  # batches smaller than one user's rows
    said = sum(users.values())
    assert report.fragments_seen == said + 1
    assert report.fragments_backfilled == said
    assert report.lines_written == 2 * said
    assert report.users == 3
    assert report.unsettled == []
    for user, rounds in users.items():
        assert await line_count(after, user) == 2 * rounds + (1 if user == "alice" else 0)

    searcher = MilvusSearch(milvus_uri, collection=after.collection, embeddings=None)
    try:
        found = await searcher.search("bob", "which item came up in round 3 zephyr3", CONFIG, NOW)
        assert any("zephyr3" in f.content and "bob" in f.content for f in found)
        assert all("alice" not in f.content for f in found)
    finally:
        await searcher.close()

    again = await backfill_lines(after)
    assert again.fragments_backfilled == 0 and again.lines_written == 0
    assert await line_count(after, "alice") == 2 * users["alice"] + 1


async def test_a_forget_or_a_rewrite_during_the_backfill_leaves_only_stored_lines(
    stores: tuple[FragmentStore, FragmentStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after the backfill writes a batch's lines, the worker forgets one fragment and
    stores another again with a line fewer (as a forget of one of its lines rewrites it)."""
    before, after = stores
    frags = history("dana", 3)
    await before.upsert(frags)
    forgotten, rewritten = frags[0], frags[1]
    shorter = rewritten.model_copy(update={"content": rewritten.content.splitlines()[0]})
    vector = HashingEmbeddings().embed_documents([shorter.content])[0]

    real = line_backfill._write
    writes: list[int] = []

    def racing(store: FragmentStore, client: Any, *, fragments: Any) -> None:
        real(store, client, fragments=fragments)
        writes.append(len(fragments))
        if len(writes) == 1:  # what the worker does meanwhile, through its own store
            client.delete(before.collection, filter=f'pk in ["{forgotten.id}"]')
            client.upsert(before.collection, [to_row(shorter, vector, notes=before._notes)])

    monkeypatch.setattr(line_backfill, "_write", racing)
    report = await backfill_lines(after)
    assert writes == [3, 1]  # the batch, then the rewritten fragment's stored version
    assert report.forgotten_meanwhile == 1
    assert report.rewritten_meanwhile == 1
    assert report.unsettled == []
    assert await line_count(after, "dana", [forgotten.id]) == 0
    assert await line_count(after, "dana", [rewritten.id]) == 1
    assert await line_count(after, "dana", [frags[2].id]) == 2
    assert await line_count(after, "dana") == 3


async def test_the_worker_migration_drops_the_earlier_line_collections(
    stores: tuple[FragmentStore, FragmentStore], redis_url: str, unique_name: str
) -> None:
    """A worker of this version, starting beside the line collections of earlier versions (rows
    with no fragment fields; rows with their fragment's fields and vector), backfills the
    current one and drops the earlier ones: nothing deletes their rows any more, so a later
    forget would leave lines there."""
    import redis.asyncio as aioredis

    from mnemoflow.activities.line_rows import earlier_lines_collections
    from mnemoflow.worker.app import migrate_to_lines

    before, after = stores
    await before.upsert(history("dana", 3))
    first, second = earlier_lines_collections(after.collection)
    await after._run_write(lambda c: _earlier_lines(c, first, before.dim))
    await after._run_write(lambda c: _earlier_lines(c, second, before.dim, fragment=True))
    redis = aioredis.Redis.from_url(redis_url)
    res = SimpleNamespace(
        store=after, read_model=SimpleNamespace(redis=redis, prefix=f"{unique_name}:")
    )
    try:
        await migrate_to_lines(res)  # type: ignore[arg-type]
    finally:
        await redis.aclose()
    for earlier in (first, second):
        assert not await after._run(lambda c, name=earlier: c.has_collection(name))
    assert await line_count(after, "dana") == 6


async def test_a_collection_named_like_an_earlier_line_collection_but_not_one_is_kept(
    stores: tuple[FragmentStore, FragmentStore],
) -> None:
    """Someone else's collection that happens to bear an earlier name is never dropped: a
    fragment collection under either name, and under the first name a collection shaped as
    the second version's lines."""
    from mnemoflow.activities.fragment_collection import build_schema
    from mnemoflow.activities.line_rows import earlier_lines_collections

    _, after = stores
    await after.ensure()
    first, second = earlier_lines_collections(after.collection)
    for name in (first, second):
        await after._run_write(
            lambda c, name=name: c.create_collection(name, schema=build_schema(after.dim))
        )
        try:
            assert await after.drop_earlier_lines() == []
            assert await after._run(lambda c, name=name: c.has_collection(name))
        finally:
            await after._run_write(lambda c, name=name: c.drop_collection(name))
    await after._run_write(lambda c: _earlier_lines(c, first, after.dim, fragment=True))
    try:
        assert await after.drop_earlier_lines() == []
        assert await after._run(lambda c: c.has_collection(first))
    finally:
        await after._run_write(lambda c: c.drop_collection(first))


async def test_a_forget_during_the_upgrade_leaves_the_earlier_line_collection_too(
    stores: tuple[FragmentStore, FragmentStore],
) -> None:
    """An agent of the earlier version searches `_lines2` until the migration drops it: a
    fragment forgotten meanwhile through a worker of this version leaves that collection too,
    as a forgotten user's lines do; once it is dropped, forgets go on without it."""
    from mnemoflow.activities.line_rows import earlier_lines_collections, line_rows

    _, after = stores
    frags = history("dana", 2) + history("erin", 1)
    _, second = earlier_lines_collections(after.collection)
    await after._run_write(lambda c: _earlier_lines(c, second, after.dim, fragment=True))
    vectors = HashingEmbeddings().embed_documents([f.content for f in frags])
    # what a worker of the earlier version wrote there: every line of every fragment
    rows = [
        {**row, "vector": v} for f, v in zip(frags, vectors, strict=True) for row in line_rows(f)
    ]
    await after._run_write(lambda c: c.insert(second, rows))
    await after.ensure()
    await after.upsert(frags)

    async def earlier(fragment_id: str) -> int:
        expr = f'fragment_id == "{fragment_id}"'
        found = await after._run(lambda c: c.query(second, filter=expr, output_fields=["count(*)"]))
        return int(found[0]["count(*)"])

    dana, kept, erin = frags[0].id, frags[1].id, frags[2].id
    assert [await earlier(i) for i in (dana, kept, erin)] == [2, 2, 2]
    await after.delete("dana", [dana])
    assert [await earlier(i) for i in (dana, kept, erin)] == [0, 2, 2]
    await after.delete_user("erin")
    assert [await earlier(i) for i in (dana, kept, erin)] == [0, 2, 0]
    assert await after.drop_earlier_lines() == [second]
    assert await after.delete("dana", [kept]) == 1
    assert await line_count(after, "dana") == 0


async def test_the_backfill_deletes_the_lines_of_fragments_an_earlier_worker_forgot(
    stores: tuple[FragmentStore, FragmentStore],
) -> None:
    """During a rolling upgrade a worker of the earlier version forgets a fragment: it deletes
    the fragment's row (and its lines in its own line collection), not the lines this version
    wrote. The backfill, run after the rollout, deletes every line row whose fragment is gone,
    and only those."""
    before, after = stores
    frags = history("dana", 3) + history("erin", 2)
    await after.ensure()
    await after.upsert(frags)
    gone = [frags[1].id, frags[3].id]  # one of dana's, one of erin's
    expr = f"pk in [{', '.join(f'{chr(34)}{i}{chr(34)}' for i in gone)}]"
    await before._run_write(lambda c: c.delete(before.collection, filter=expr))
    assert await line_count(after, "dana") == 6 and await line_count(after, "erin") == 4

    report = await backfill_lines(after, batch=3)  # several batches of line rows
    assert report.orphan_lines_deleted == 4
    assert report.fragments_backfilled == 0
    assert await line_count(after, "dana", [frags[1].id]) == 0
    assert await line_count(after, "erin", [frags[3].id]) == 0
    assert await line_count(after, "dana") == 4 and await line_count(after, "erin") == 2
    again = await backfill_lines(after)
    assert again.orphan_lines_deleted == 0 and again.lines_written == 0


def _earlier_lines(client: Any, name: str, dim: int, *, fragment: bool = False) -> None:
    """A line collection as an earlier version made it (`tests/support/line_layouts.py`)."""
    from tests.support.line_layouts import earlier_line_schema

    client.create_collection(name, schema=earlier_line_schema(dim, fragment=fragment))
