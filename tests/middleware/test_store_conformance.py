"""MnemoflowStore against the behaviours LangGraph's own store tests check (get, put, overwrite,
delete, search with filter, limit and offset, namespace listing, namespace and TTL errors), on
the dev server with the real worker, Milvus Lite and Redis. What is stored is checked in Milvus
too, not only through the store's own reads. The store reads its items from Milvus's fragment
collection; after each test Redis holds no fragment copy."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from langgraph.store.base import GetOp, InvalidNamespaceError, PutOp, SearchOp
from temporalio.testing import WorkflowEnvironment

from mnemoflow import MnemoflowStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware.store_items import STORE_THEME_PREFIX
from mnemoflow.models.errors import InvalidInputError
from tests.middleware.conftest import LiveMemory
from tests.support.drive import eventually
from tests.support.memory_worker import memory_worker

pytestmark = pytest.mark.integration


@pytest.fixture
async def live_memory(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> AsyncIterator[LiveMemory]:
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        async with mw.memory_client(redis_url) as client:
            yield LiveMemory(mw, client)
        # The store's reads came from Milvus: Redis holds no fragment copy of any user.
        redis, prefix = mw.read_model.redis, mw.read_model.prefix
        assert [k async for k in redis.scan_iter(f"{prefix}corpus:*")] == []


async def stored_values(live_memory: LiveMemory, user: str, key: str) -> list[str]:
    """The contents of the key's fragments in Milvus (what survives any cache)."""
    rows = await live_memory.worker.store.all_for_user(user)
    return [r.content for r in rows if r.theme == f"{STORE_THEME_PREFIX}{key}"]


async def test_get_put_overwrite_delete(live_memory: LiveMemory) -> None:
    store = MnemoflowStore(live_memory.client)
    user = live_memory.new_user("store-crud")
    ns = ("memories", user)
    assert await store.aget(ns, "profile") is None

    value = {
        "text": "Ada prefers green tea, 不加糖",
        "n": 3,
        "ratio": 0.125,
        "tags": ["tea", None, True],
        "nested": {"city": "Zürich", "floor": -1},
    }
    before = datetime.now().astimezone()
    await store.aput(ns, "profile", value)
    item = await store.aget(ns, "profile")
    assert item is not None
    assert (item.key, item.namespace, item.value) == ("profile", ns, value)
    assert item.created_at == item.updated_at and item.created_at >= before.replace(microsecond=0)
    assert len(await stored_values(live_memory, user, "profile")) == 1

    # Overwrite: get returns the latest, search never returns the stale one, Milvus holds one.
    newer = {"text": "Ada switched to oolong", "n": 4}
    await store.aput(ns, "profile", newer)
    got = await store.aget(ns, "profile")
    assert got is not None and got.value == newer and got.updated_at >= item.updated_at
    for query in (None, "oolong"):
        found = await store.asearch(ns, query=query)
        assert [(r.key, r.value) for r in found] == [("profile", newer)], query
    assert all(r.value != value for r in await store.asearch(ns, query="green tea sugar"))
    assert len(await stored_values(live_memory, user, "profile")) == 1
    assert "oolong" in (await stored_values(live_memory, user, "profile"))[0]

    # A second key is independent of the first.
    await store.aput(ns, "other", {"text": "lives in Lyon"})
    await store.adelete(ns, "profile")
    assert await store.aget(ns, "profile") is None
    assert "profile" not in {r.key for r in await store.asearch(ns, query="oolong")}
    assert [r.key for r in await store.asearch(ns)] == ["other"]
    assert await stored_values(live_memory, user, "profile") == []

    # A deleted key can be put again (a new fragment: the forgotten one stays forgotten).
    again = {"text": "Ada is back on green tea"}
    await store.aput(ns, "profile", again)
    got = await store.aget(ns, "profile")
    assert got is not None and got.value == again
    assert {r.key for r in await store.asearch(ns)} == {"profile", "other"}

    # put(value=None) is a delete; deleting a missing key is a no-op.
    await store.abatch([PutOp(ns, "profile", None)])
    assert await store.aget(ns, "profile") is None
    await store.adelete(ns, "never-put")
    assert [r.key for r in await store.asearch(ns)] == ["other"]

    # A batch runs in order: the last put of a key wins and a get sees what came before it.
    results = await store.abatch(
        [
            PutOp(ns, "b", {"v": 1}),
            PutOp(ns, "b", {"v": 2}),
            GetOp(ns, "b"),
            SearchOp(ns, filter={"v": 2}),
        ]
    )
    assert results[0] is None and results[1] is None
    assert results[2] is not None and results[2].value == {"v": 2}
    assert [r.key for r in results[3]] == ["b"]
    assert len(await stored_values(live_memory, user, "b")) == 1


async def test_search_filter_limit_offset_and_scores(live_memory: LiveMemory) -> None:
    store = MnemoflowStore(live_memory.client)
    user = live_memory.new_user("store-search")
    ns = ("memories", user)
    docs = {
        "k0": {"text": "Ada's order 7734-221 is late", "kind": "order", "score": 1},
        "k1": {"text": "Ada is busy on Wednesdays", "kind": "schedule", "score": 2},
        "k2": {"text": "Ada prefers email to phone calls", "kind": "contact", "score": 3},
        "k3": {"text": "Ada's second order 5512-009 shipped", "kind": "order", "score": 4},
        "k4": {"text": "阿达喜欢绿茶，不加糖", "kind": "taste", "score": 5, "meta": {"lang": "zh"}},
    }
    for key, value in docs.items():
        await store.aput(ns, key, value)

    everything = await store.asearch(ns, limit=10)
    assert [r.key for r in everything] == ["k4", "k3", "k2", "k1", "k0"]  # newest first
    assert all(r.value == docs[r.key] and r.namespace == ns for r in everything)

    # filter: equality, operators, nested objects
    assert {r.key for r in await store.asearch(ns, filter={"kind": "order"})} == {"k0", "k3"}
    assert {r.key for r in await store.asearch(ns, filter={"score": {"$gte": 4}})} == {"k3", "k4"}
    assert {r.key for r in await store.asearch(ns, filter={"score": {"$lt": 2}})} == {"k0"}
    assert {r.key for r in await store.asearch(ns, filter={"kind": {"$ne": "order"}})} == {
        "k1",
        "k2",
        "k4",
    }
    assert [r.key for r in await store.asearch(ns, filter={"meta": {"lang": "zh"}})] == ["k4"]
    assert await store.asearch(ns, filter={"kind": "nothing"}) == []
    with pytest.raises(ValueError, match="unknown filter operator"):
        await store.asearch(ns, filter={"score": {"$regex": "x"}})

    # limit and offset page through without overlap
    pages = [await store.asearch(ns, limit=2, offset=o) for o in (0, 2, 4)]
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [r.key for p in pages for r in p] == [r.key for r in everything]
    assert await store.asearch(ns, limit=2, offset=5) == []

    # a query ranks with scores; the relevant item first, in English and in Chinese
    ranked = await store.asearch(ns, query="when is Ada busy? Wednesdays")
    assert ranked and ranked[0].key == "k1"
    assert all(isinstance(r.score, float) for r in ranked)
    assert [r.score for r in ranked] == sorted((r.score or 0.0 for r in ranked), reverse=True)
    assert (await store.asearch(ns, query="绿茶加糖吗"))[0].key == "k4"
    orders = await store.asearch(ns, query="order late shipped", filter={"kind": "order"})
    assert {r.key for r in orders} == {"k0", "k3"}
    one = await store.asearch(ns, query="order late shipped", filter={"kind": "order"}, limit=1)
    second = await store.asearch(
        ns, query="order late shipped", filter={"kind": "order"}, limit=1, offset=1
    )
    assert len(one) == len(second) == 1 and one[0].key != second[0].key

    # another user's items are never found
    other = ("memories", live_memory.new_user("store-other"))
    await store.aput(other, "k1", {"text": "Bo is busy on Wednesdays"})
    assert [r.value for r in await store.asearch(other, query="Wednesdays")] == [
        {"text": "Bo is busy on Wednesdays"}
    ]
    assert (await store.aget(ns, "k1")).value == docs["k1"]  # type: ignore[union-attr]


async def test_namespaces_ttl_and_bad_values(live_memory: LiveMemory) -> None:
    store = MnemoflowStore(live_memory.client, namespace=("app", "{user_id}", "memories"))
    users = sorted(live_memory.new_user(f"store-ns{i}") for i in range(2))
    for user in users:
        await store.aput(("app", user, "memories"), "k", {"who": user})

    for bad in [("memories", users[0]), ("app", users[0]), ("app", users[0], "notes"), ("app",)]:
        with pytest.raises(InvalidNamespaceError, match="does not match"):
            await store.aget(bad, "k")
        with pytest.raises(InvalidNamespaceError, match="does not match"):
            await store.aput(bad, "k", {"a": 1})
        with pytest.raises(InvalidNamespaceError, match="does not match"):
            await store.asearch(bad)
    with pytest.raises(InvalidNamespaceError):  # LangGraph's own label rule
        await store.aput(("app", "a.b", "memories"), "k", {"a": 1})
    with pytest.raises(ValueError, match="exactly once"):
        MnemoflowStore(live_memory.client, namespace=("memories",))

    expected = [("app", u, "memories") for u in users]

    async def listed() -> bool:
        return await store.alist_namespaces(prefix=("app",)) == expected

    await eventually(listed, deadline_s=20, what="users listed")  # visibility follows
    assert await store.alist_namespaces(suffix=("memories",)) == expected
    assert await store.alist_namespaces(prefix=("app", "*", "memories")) == expected
    assert await store.alist_namespaces(prefix=("app", users[1])) == [expected[1]]
    assert await store.alist_namespaces(prefix=("elsewhere",)) == []
    assert await store.alist_namespaces(max_depth=2) == [("app", u) for u in users]
    assert await store.alist_namespaces(max_depth=1) == [("app",)]
    assert await store.alist_namespaces(limit=1) == expected[:1]
    assert await store.alist_namespaces(limit=1, offset=1) == expected[1:]

    ns = expected[0]
    with pytest.raises(NotImplementedError, match="TTL"):
        await store.aput(ns, "t", {"a": 1}, ttl=5)
    with pytest.raises(NotImplementedError, match="expire"):
        await store.abatch([PutOp(ns, "t", {"a": 1}, ttl=5.0)])
    with pytest.raises(NotImplementedError, match="TTL"):
        MnemoflowStore(live_memory.client, ttl={"default_ttl": 5})
    for value, match in [
        ({"s": {1, 2}}, "plain JSON"),
        ({"x": float("nan")}, "plain JSON"),
        (["not", "a", "dict"], "JSON object"),
        ({"text": "x" * 9000}, "at most"),
    ]:
        with pytest.raises(InvalidInputError, match=match):
            await store.aput(ns, "bad", value)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at most"):
        await store.aput(ns, "k" * 300, {"a": 1})
    assert await store.aget(ns, "bad") is None and await store.aget(ns, "t") is None
    assert [r.key for r in await store.asearch(ns)] == ["k"]


async def test_sync_methods_from_a_worker_thread(live_memory: LiveMemory) -> None:
    store = MnemoflowStore(live_memory.client)
    user = live_memory.new_user("store-sync")
    ns = ("memories", user)

    def sync_calls() -> tuple[object, ...]:
        store.put(ns, "k", {"text": "from a thread"})
        got = store.get(ns, "k")
        found = store.search(ns, query="thread")
        store.delete(ns, "k")
        return got.value if got else None, [r.key for r in found], store.get(ns, "k")

    assert await asyncio.to_thread(sync_calls) == ({"text": "from a thread"}, ["k"], None)
    with pytest.raises(RuntimeError, match="use the async method"):
        store.get(ns, "k")  # on the client's own loop it would block that loop
