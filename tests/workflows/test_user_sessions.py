"""Session end, explicit memory and config changes on the dev server, through MemoryClient."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.models.config import Vocation
from mnemoflow.models.contracts import ConfigUpdate
from mnemoflow.models.ids import user_workflow_id
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, eventually, status, submit, wait_status
from tests.support.memory_worker import MemoryWorker, memory_worker
from tests.support.replay import assert_replays

LINES = [
    "Hi, I'm Bea and my parcel 8812 arrived with a cracked screen.",
    "Sorry about that, Bea. A replacement is on its way.",
    "Please ship it to 4 Elm Street, Leeds, and email me the tracking code.",
    "Done: 4 Elm Street, Leeds; the tracking code goes to your email.",
]


def new_user(tag: str, mw: MemoryWorker | None = None) -> str:
    """A fresh user id; with `mw`, its workflow is terminated when the worker stops."""
    user = f"{tag}-{uuid.uuid4().hex[:8]}"
    if mw is not None:
        mw.track(user_workflow_id(user))
    return user


@asynccontextmanager
async def session(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str, models: Any = None
) -> AsyncIterator[tuple[MemoryWorker, MemoryClient]]:
    """A memory worker (offline models by default) and a MemoryClient reading its read model."""
    async with memory_worker(
        env.client,
        milvus_uri=milvus_uri,
        redis_url=redis_url,
        models=models or HeuristicMemoryModels(),
    ) as mw:
        client = mw.memory_client(redis_url)
        try:
            yield mw, client
        finally:
            await client.aclose()


async def test_consolidate_slices_a_fresh_session_without_waiting_for_maturity(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with session(dev_env, milvus_uri, redis_url) as (mw, client):
        user = new_user("bea", mw)
        # Said just now: the customer-service slice gate is ~14.5 minutes away.
        await client.submit(user, conversation("s1", LINES, time.time(), step=1.0))
        await client.submit(user, conversation("s2", LINES[:2], time.time(), step=1.0))
        result = await client.consolidate(user, "s1")
        assert result.thread_id == "s1" and result.pending_turns == len(LINES)

        handle = dev_env.client.get_workflow_handle(user_workflow_id(user))
        done = await wait_status(
            handle,
            lambda s: s.watermarks.get("s1") is not None and s.watermarks["s1"].indexed == 4,
            deadline_s=60,
            what="the consolidated session indexed",
        )
        assert done.rounds_completed == 1 and done.rounds[-1].trigger == "consolidate"
        assert await mw.store.count(user) == done.rounds[-1].fragments > 0
        # Only the consolidated thread was sliced: the other session still waits for maturity.
        assert done.watermarks["s2"].indexed == 0 and done.pending_turns == 2
        published = await client.context(user)
        assert published is not None and published.watermarks["s1"].indexed == len(LINES)

        # Nothing pending (or no memory at all): consolidate schedules nothing.
        assert (await client.consolidate(user, "s1")).pending_turns == 0
        assert (await client.consolidate(new_user("nobody"), "s1")).pending_turns == 0
        after = await status(handle)
        assert after.rounds_started == 1
        with pytest.raises(ValueError):
            await client.consolidate(user, "")
        ids = [user_workflow_id(user), done.rounds[-1].workflow_id]
        assert await assert_replays(dev_env.client, ids, name="sessions-consolidate") == 2


async def test_a_remembered_fact_is_published_at_once(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with session(dev_env, milvus_uri, redis_url) as (mw, client):
        user = new_user("gus", mw)
        await client.submit(user, conversation("t", LINES, time.time() - 7200), urgent=True)
        handle = dev_env.client.get_workflow_handle(user_workflow_id(user))
        first = await wait_status(
            handle,
            lambda s: s.rounds_completed == 1 and s.inductions >= 1 and s.uninducted == 0,
            deadline_s=60,
            what="the round and the induction of its fragments",
        )
        before = await mw.read_model.get(user)
        assert before is not None and before.fragments

        saved = await client.remember(user, "Gus is allergic to peanuts.", event_id="m-1")
        # No round ran since: the fact is in the read model the next model call reads.
        published = await mw.read_model.get(user)
        assert published is not None and published.version > before.version
        assert published.fragments[0].id == saved.fragment_id
        assert published.fragments[0].content == "Gus is allergic to peanuts."
        assert published.fragments[0].score >= max(f.score for f in before.fragments)
        assert published.profile == before.profile
        assert {f.id for f in before.fragments} <= {f.id for f in published.fragments}
        seen = await client.context(user)
        assert seen is not None and seen.fragments[0].id == saved.fragment_id
        assert (await status(handle)).rounds_started == first.rounds_started

        # A user with nothing published yet gets a context holding just the fact.
        fresh = new_user("ida", mw)
        own = await client.remember(fresh, "Ida's locker code is 4711.")
        context = await mw.read_model.get(fresh)
        assert context is not None and [f.id for f in context.fragments] == [own.fragment_id]
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="sessions-remember")


class GatedModels(HeuristicMemoryModels):
    """The offline models, with slicing held until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.slicing = asyncio.Event()
        self.gate = asyncio.Event()

    async def slice(self, turns, max_fragments):  # type: ignore[no-untyped-def]
        self.slicing.set()
        await self.gate.wait()
        return await super().slice(turns, max_fragments)


async def test_a_fact_remembered_while_a_round_runs_stays_in_front_after_it(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    models = GatedModels()
    async with session(dev_env, milvus_uri, redis_url, models) as (mw, client):
        user = new_user("joy", mw)
        await client.submit(user, conversation("t", LINES, time.time() - 7200), urgent=True)
        await asyncio.wait_for(models.slicing.wait(), timeout=60)
        saved = await client.remember(user, "Joy is allergic to peanuts.", event_id="m-1")
        during = await mw.read_model.get(user)
        assert during is not None and [f.id for f in during.fragments] == [saved.fragment_id]

        models.gate.set()
        handle = dev_env.client.get_workflow_handle(user_workflow_id(user))
        done = await wait_status(handle, lambda s: s.rounds_completed == 1, deadline_s=60)

        # The round publishes the version the fact already has; the user workflow then
        # publishes the next one with the fact back in front.
        async def republished() -> bool:
            latest = await mw.read_model.get(user)
            return latest is not None and latest.version > during.version

        await eventually(republished, deadline_s=30, what="the context after the round")
        published = await mw.read_model.get(user)
        assert published is not None and published.fragments[0].id == saved.fragment_id
        assert len(published.fragments) == done.rounds[-1].fragments + 1
        await assert_replays(dev_env.client, [user_workflow_id(user)], name="sessions-racing")


async def test_a_config_change_survives_continue_as_new_and_bad_values_change_nothing(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with session(dev_env, milvus_uri, redis_url) as (mw, client):
        user = new_user("hal")
        turns = conversation("t", [f"detail number {i}" for i in range(60)], time.time())
        handle = await submit(dev_env.client, mw.task_queue, user, turns[:1], max_history_events=50)

        with pytest.raises(ValueError, match="slice_gate"):
            await client.update_config(user, params={"slice_gate": 1.5})
        with pytest.raises(ValueError, match="unknown memory config fields: gate"):
            await client.update_config(user, params={"gate": 0.5})
        # The workflow checks too (a client without the local check, e.g. another SDK).
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(
                UserMemoryWorkflow.update_config, ConfigUpdate(params={"top_k": 0})
            )
        assert (await status(handle)).config.vocation == Vocation.CUSTOMER_SERVICE

        config = await client.update_config(user, vocation="accompany", params={"top_k": 7})
        assert (config.vocation, config.top_k, config.slice_gate) == ("accompany", 7, 0.8)
        for turn in turns[1:]:  # more signals than the history cap: continue-as-new
            await submit(dev_env.client, mw.task_queue, user, [turn], max_history_events=50)
        done = await wait_status(
            handle,
            lambda s: s.continued >= 1 and s.pending_turns == len(turns),
            what="continue-as-new with every turn queued",
        )
        assert done.config == config
        assert done.pending_turns == len(turns) and done.rounds_started == 0
