"""Two writers of one key at once (two MemoryClients, as two agent processes would have): one
value wins everywhere, the same for both readers, in Milvus and in the injected context, and
no stale value is left for the middleware to inject. Dev server, real worker, Milvus Lite and
Redis; the worker's fragment store can hold one writer's write, to force the interleaving where
the earlier put lands in the store after the later one has returned."""

from __future__ import annotations

import asyncio
import json
from typing import Any, ClassVar

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow import MnemoflowStore
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware.store_items import STORE_THEME_PREFIX
from mnemoflow.models.fragments import Fragment
from tests.middleware.conftest import LiveMemory
from tests.support.memory_worker import memory_worker

pytestmark = pytest.mark.integration

THEME = f"{STORE_THEME_PREFIX}k"


class HoldingStore(FragmentStore):
    """Holds the write of a fragment holding `mark` until `gate` is set."""

    mark: ClassVar[str | None] = None
    gate: ClassVar[asyncio.Event | None] = None
    entered: ClassVar[asyncio.Event | None] = None

    async def upsert_vectors(
        self, fragments: list[Fragment], **kwargs: Any
    ) -> list[tuple[Fragment, list[float]]]:
        cls = type(self)
        if cls.mark and cls.gate and cls.entered and any(cls.mark in f.content for f in fragments):
            cls.entered.set()
            await cls.gate.wait()
        return await super().upsert_vectors(fragments, **kwargs)


async def one_value_everywhere(
    live: LiveMemory, stores: list[MnemoflowStore], user: str, values: list[dict[str, Any]]
) -> dict[str, Any]:
    """The value both readers get, checked against the search, Milvus and the context."""
    ns = ("memories", user)
    got = [await s.aget(ns, "k") for s in stores]
    assert got[0] is not None and got[1] is not None
    winner = got[0].value
    assert got[1].value == winner and winner in values
    for store in stores:
        assert [(i.key, i.value) for i in await store.asearch(ns)] == [("k", winner)]
    rows = await live.worker.store.all_for_user(user)
    assert [json.loads(r.content) for r in rows if r.theme == THEME] == [winner]
    context = await live.client.context(user)
    assert context is not None
    assert [json.loads(f.content) for f in context.fragments if f.theme == THEME] == [winner]
    return winner


async def test_concurrent_puts_of_one_key_leave_one_value(
    live_memory: LiveMemory, redis_url: str
) -> None:
    user = live_memory.new_user("store-writers")
    ns = ("memories", user)
    async with live_memory.worker.memory_client(redis_url) as other_client:
        stores = [MnemoflowStore(live_memory.client), MnemoflowStore(other_client)]
        for n in range(4):
            values = [{"text": f"writer {w} says {n}", "writer": w} for w in ("a", "b")]
            await asyncio.gather(*(s.aput(ns, "k", v) for s, v in zip(stores, values, strict=True)))
            await one_value_everywhere(live_memory, stores, user, values)


async def test_an_earlier_put_landing_after_a_later_one_returned_is_not_left_behind(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    class Held(HoldingStore):
        mark = '"writer": "a"'
        gate = asyncio.Event()
        entered = asyncio.Event()

    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=Held,
    ) as mw:  # fmt: skip
        async with mw.memory_client(redis_url) as one, mw.memory_client(redis_url) as two:
            live = LiveMemory(mw, one)
            user = live.new_user("store-late")
            ns = ("memories", user)
            stores = [MnemoflowStore(one), MnemoflowStore(two)]
            values = [{"text": "writer a was first", "writer": "a"}, {"text": "b", "writer": "b"}]
            earlier = asyncio.create_task(stores[0].aput(ns, "k", values[0]))
            await asyncio.wait_for(Held.entered.wait(), 30)  # a's fragment is made, not stored
            await stores[1].aput(ns, "k", values[1])  # b's put is later, and returns first
            Held.gate.set()
            await earlier
            assert await one_value_everywhere(live, stores, user, values) == values[1]
