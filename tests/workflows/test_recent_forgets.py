"""Forgets and the contents the user workflow keeps of its latest rounds (state `recent`,
docs/ARCHITECTURE.md "The round"): a kept fragment whose delete's reply is lost is still
forgotten everywhere, and a forget that fails while its fragment's round runs leaves the
fragment kept, as every fragment of a round vouched for must be (the workflow's own answer then
holds what Redis holds)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, ClassVar

from temporalio.client import WorkflowHandle, WorkflowUpdateFailedError
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ForgetFragmentRequest, UserStatus
from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.ids import fragment_id
from mnemoflow.models.turns import ChatTurn
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.drive import conversation, eventually, submit, wait_status
from tests.support.memory_worker import MemoryWorker, memory_worker

HOUR = 3600.0
CONFIG = MemoryConfig.from_vocation("customer service").model_copy(
    update={"published_candidates": 4, "top_k": 2}
)
THINGS = ["bike chain", "garden hose", "oven door", "car tyre", "attic window", "piano", "kettle"]
NAMES = ["Ingrid", "Bartholomew", "Chiamaka", "Dmitri", "Esperanza", "Gustavo", "Haruki"]


def exchange(n: int, at: float, lead: str = "") -> list[ChatTurn]:
    """Round n's two turns, distinct from every other round's."""
    said = f"{lead}Errand {n:03d}-{(n * 7919) % 1000:03d}: the {THINGS[n % 7]} of {NAMES[n % 7]}"
    turns = conversation("t", [f"{said} needs fixing by day {n + 3}.", f"Noted errand {n}."], at)
    return [t.model_copy(update={"position": 2 * n + t.position}) for t in turns]


async def say(mw: MemoryWorker, user: str, turns: list[ChatTurn]) -> WorkflowHandle:
    """Hand the turns over as one urgent event and wait until they are indexed."""
    handle = await submit(mw.client, mw.task_queue, user, turns, urgent=True, config=CONFIG)
    end = turns[-1].position + 1

    def indexed(s: UserStatus) -> bool:
        return "t" in s.watermarks and s.watermarks["t"].indexed >= end

    await wait_status(handle, indexed, deadline_s=90, what=f"indexed {end}")
    return handle


class Store(FragmentStore):
    """Holds the store step after it read its candidates (`gate`); loses the reply of a delete
    of the ids in `lose` (the row is gone, then the call fails once); refuses for good to
    delete the ids in `refuse`."""

    gate: asyncio.Event | None = None
    entered: asyncio.Event | None = None
    lose: ClassVar[set[str]] = set()
    refuse: ClassVar[set[str]] = set()

    async def candidates(self, user_id: str, *args: Any, **kwargs: Any) -> Any:
        found = await super().candidates(user_id, *args, **kwargs)
        cls = type(self)
        if cls.gate is not None and cls.entered is not None:
            cls.entered.set()
            await cls.gate.wait()
        return found

    async def delete(self, user_id: str, ids: list[str]) -> int:
        cls = type(self)
        if set(ids) & cls.refuse:
            raise InvalidInputError("the delete fails for good (test)")
        deleted = await super().delete(user_id, ids)
        if set(ids) & cls.lose:
            cls.lose -= set(ids)
            raise ConnectionError("the reply was lost (test)")
        return deleted


async def test_a_kept_fragment_whose_delete_reply_is_lost_is_still_forgotten(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    class S(Store):
        lose: ClassVar[set[str]] = set()

    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url,
        models=HeuristicMemoryModels(), store_cls=S,
    ) as mw:  # fmt: skip
        user = f"lost-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 3 * HOUR
        handle = None
        for n in range(7):
            handle = await say(mw, user, exchange(n, t0 + n * 60))
        assert handle is not None
        await wait_status(handle, lambda s: s.uninducted == 0, what="inducted")
        published = await mw.read_model.get(user)
        assert published is not None
        shown = {f.id for f in published.fragments}
        only_kept = [f for f in await mw.store.all_for_user(user) if f.id not in shown]
        assert only_kept, "every fragment is published: nothing to test"
        victim = only_kept[-1]
        S.lose = {victim.id}
        out = await handle.execute_update(
            UserMemoryWorkflow.forget_fragment, ForgetFragmentRequest(fragment_id=victim.id)
        )
        assert not S.lose, "the delete did not lose its reply"
        assert await mw.store.get(user, [victim.id]) == []
        # The retried delete found nothing; the state still named it (kept), so it is forgotten.
        assert out.deleted == 1, out


async def test_a_failed_forget_during_its_round_leaves_the_fragment_kept(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    client = dev_env.client

    class S(Store):
        refuse: ClassVar[set[str]] = set()

    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels(),
        store_cls=S,
    ) as mw:  # fmt: skip
        user = f"ffail-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 30 * 60
        handle = None
        for n in range(4):
            handle = await say(mw, user, exchange(n, t0 + n * 30))
        assert handle is not None
        # Round 5 is held after its write; a forget of its fragment fails for good meanwhile.
        S.gate, S.entered = asyncio.Event(), asyncio.Event()
        await submit(client, mw.task_queue, user, exchange(4, t0 + 120), urgent=True, config=CONFIG)
        await asyncio.wait_for(S.entered.wait(), timeout=60)
        running = await wait_status(handle, lambda s: s.rounds[-1].status == "running")
        victim = fragment_id(user, running.rounds[-1].round_no, 0)
        assert await mw.store.get(user, [victim]), "the held round has not written yet"
        S.refuse = {victim}
        try:
            await handle.execute_update(
                UserMemoryWorkflow.forget_fragment, ForgetFragmentRequest(fragment_id=victim)
            )
            raise AssertionError("the forget should have failed")
        except WorkflowUpdateFailedError:
            pass
        S.gate.set()
        S.gate, S.refuse = None, set()
        await wait_status(handle, lambda s: s.watermarks["t"].indexed >= 10, what="round 5")
        # Other subjects until the fragment left the selection, then back to its subject.
        n = 5
        while True:
            current = await mw.read_model.get(user)
            if current is not None and victim not in {f.id for f in current.fragments}:
                break
            handle = await say(mw, user, exchange(n, t0 + n * 30))
            n += 1
            assert n < 20, "the fragment never left the selection"
        came_back = 0
        again = f"Back to errand 004: the {THINGS[4]} of {NAMES[4]} needs fixing by day 7. "
        for m in range(n, n + 3):
            await say(mw, user, exchange(m, t0 + m * 30, lead=again))
            redis = await mw.read_model.get(user)
            own = await handle.query(UserMemoryWorkflow.context)
            assert redis is not None
            top = [f.id for f in redis.fragments[: CONFIG.top_k]]
            came_back += victim in top
            # What one model call injects is in the workflow's own answer too, whole.
            held = {f.id: f.content for f in own.fragments}
            assert all(fid in held for fid in top), (m, top, list(held))
        assert came_back, "the fragment never came back to the top: nothing tested"


async def test_a_round_that_read_a_fragment_before_its_forget_never_publishes_it(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """A round's store step read its candidates, then the user forgot one of them: once the
    forget returned, Redis never shows that fragment again (the round's own publish is refused,
    its selection goes out cleaned when it completes)."""
    client = dev_env.client

    class S(Store):
        pass

    async with memory_worker(
        client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels(),
        store_cls=S,
    ) as mw:  # fmt: skip
        user = f"race-{uuid.uuid4().hex[:8]}"
        t0 = time.time() - 20 * 60  # said recently: no induction runs meanwhile
        handle = None
        for n in range(6):
            handle = await say(mw, user, exchange(n, t0 + n * 30))
        assert handle is not None
        said = exchange(2, t0)[0].content
        [victim] = [f for f in await mw.store.all_for_user(user) if said in f.content]
        # Round 7 comes back to the victim's subject; its store step waits after reading.
        S.gate, S.entered = asyncio.Event(), asyncio.Event()
        again = f"Back to errand 002: the {THINGS[2]} of {NAMES[2]} needs fixing by day 5. "
        await submit(
            client, mw.task_queue, user, exchange(6, t0 + 180, lead=again), urgent=True,
            config=CONFIG,
        )  # fmt: skip
        seen: list[int] = []

        async def watch() -> None:
            while True:
                ctx = await mw.read_model.get(user)
                if ctx is not None and any(said in f.content for f in ctx.fragments):
                    seen.append(ctx.version)
                await asyncio.sleep(0.002)

        try:
            await asyncio.wait_for(S.entered.wait(), timeout=60)
            out = await handle.execute_update(
                UserMemoryWorkflow.forget_fragment, ForgetFragmentRequest(fragment_id=victim.id)
            )
            assert out.deleted == 1 and out.republished, out
            watcher = asyncio.create_task(watch())
        finally:
            S.gate.set()
            S.gate = None
        try:
            done = await wait_status(handle, lambda s: s.watermarks["t"].indexed >= 14)

            # The round's selection is what Redis ends with, cleaned, above the forget's.
            async def settled() -> bool:
                ctx = await mw.read_model.get(user)
                own = await handle.query(UserMemoryWorkflow.context)
                return (
                    ctx is not None
                    and [f.id for f in ctx.fragments] == [f.id for f in own.fragments]
                    and ctx.version == own.version
                )

            await eventually(settled, what="the round's selection published")
        finally:
            watcher.cancel()
        assert done.rounds[-1].status == "completed"
        assert not seen, f"Redis showed the forgotten fragment again: versions {seen}"
        own = await handle.query(UserMemoryWorkflow.context)
        assert victim.id not in {f.id for f in own.fragments}
