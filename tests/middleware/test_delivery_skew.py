"""Forgets among writers whose clocks disagree with the worker's (docs/ARCHITECTURE.md, "Forget
epochs"), seeded: three agent processes' clients (own checkpointers, two on one thread) with
clocks 10 s behind, on time and 10 s ahead of the worker's; the user forgotten twice, by a
random writer, between turns; sessions consolidated at random turns, so rounds run (and are
cancelled by a forget) while turns go on; one of the two worker processes SIGKILLed at a random
turn. Stored lines must be exactly the lines said after the last forget, each once: none said
before it comes back, none said after it is lost, whatever the writer's clock.

`MNEMOFLOW_SKEW_SEEDS` (comma separated) replaces the seeds run.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest
from langchain.agents import create_agent
from langchain_core.messages import BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from tests.middleware.test_delivery import Ctx, line, settled
from tests.support.chat import ReceiptModel, receipt
from tests.support.drive import STARTED
from tests.support.invariants import said_vs_stored
from tests.support.memory_worker import memory_worker, terminate_started
from tests.support.reliability import Ledger
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

SEEDS = [int(s) for s in os.environ.get("MNEMOFLOW_SKEW_SEEDS", "29,2901,290101").split(",")]
TURNS = 30
#: Each writer's clock against the worker's (seconds).
SKEWS = (-10.0, 0.0, 10.0)
THREADS = ("shared", "shared", "side")


class HeldModel(ReceiptModel):
    """The receipt model, whose answer waits for the test once `hold` is set (a slow model
    call: the turn spans whatever the test does meanwhile)."""

    hold: ClassVar[asyncio.Event | None] = None
    entered: ClassVar[asyncio.Event | None] = None

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        cls = type(self)
        if cls.hold is not None and cls.entered is not None:
            cls.entered.set()
            await cls.hold.wait()
        return self._generate(messages, stop)


class SkewedWriter:
    """One agent process whose clock is `skew` seconds off the worker's."""

    def __init__(
        self, client: MemoryClient, skew: float, model: ReceiptModel | None = None
    ) -> None:
        self.skew = skew
        self.memory = DurableMemoryMiddleware(client=client, clock=lambda: time.time() + skew)
        self.agent = create_agent(
            model or ReceiptModel(), [], middleware=[self.memory], context_schema=Ctx,
            checkpointer=InMemorySaver(),
        )  # fmt: skip

    async def say(self, user: str, thread: str, text: str) -> str:
        config = {"configurable": {"thread_id": thread}}
        result = await self.agent.ainvoke(
            {"messages": [HumanMessage(text)]}, config, context=Ctx(user)
        )
        reply = str(result["messages"][-1].content)
        assert reply == receipt(text), "the turn went on"
        return reply


@pytest.mark.parametrize("seed", SEEDS)
async def test_skewed_writers_forgets_and_a_worker_kill_store_exactly_what_was_kept(
    seed: int,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random(seed)
    tag = uuid.uuid4().hex[:10]
    task_queue, collection, prefix = f"tq-skew-{tag}", f"t_skew_{tag}", f"test:{tag}:"
    # A round whose workflow task the killed worker held is handed out again after 10 s.
    common = dict(
        address=dev_env.client.service_client.config.target_host, task_queue=task_queue,
        milvus=milvus_uri, redis=redis_url, collection=collection, prefix=prefix,
        round_task_timeout_s=10.0,
    )  # fmt: skip
    forgets = sorted(rng.sample(range(5, TURNS - 5), 2))
    kill_at = rng.choice([i for i in range(4, TURNS - 4) if i not in forgets])
    consolidations = set(rng.sample(range(2, TURNS), 6))
    store = FragmentStore(uri=milvus_uri, embeddings=HashingEmbeddings(), collection=collection)
    clients = [
        MemoryClient(
            temporal=dev_env.client, task_queue=task_queue, redis=redis_url, key_prefix=prefix,
            signal_timeout_s=2.0, close_timeout_s=60.0,
        )
        for _ in SKEWS
    ]  # fmt: skip
    writers = [SkewedWriter(c, skew) for c, skew in zip(clients, SKEWS, strict=True)]
    user = f"skew-{tag}"
    STARTED.setdefault(task_queue, set()).add(clients[0].workflow_id(user))
    forgotten: list[str] = []  # every line said before the last forget
    kept: dict[str, list[str]] = {"shared": [], "side": []}  # said since the last forget
    by_skew = {skew: 0 for skew in SKEWS}  # lines kept, per writer clock
    epochs: list[int] = []
    try:
        with (
            worker_process(tmp_path, "victim", **common) as victim,
            worker_process(tmp_path, "survivor", **common),
        ):
            for i in range(TURNS):
                if i in forgets:
                    who = rng.randrange(len(clients))
                    receipt_ = await clients[who].forget(user, f"forget before turn {i}")
                    epochs.append(receipt_.epoch)
                    forgotten += kept["shared"] + kept["side"]
                    kept = {"shared": [], "side": []}
                    by_skew = {skew: 0 for skew in SKEWS}
                if i == kill_at:
                    os.kill(victim.pid, signal.SIGKILL)
                w = rng.randrange(len(writers))
                text = line(rng, i, f"w{w}")
                kept[THREADS[w]] += [text, await writers[w].say(user, THREADS[w], text)]
                by_skew[SKEWS[w]] += 2
                if i in consolidations:
                    await clients[w].consolidate(user, THREADS[w])
            for writer in writers:
                assert await writer.memory.flush(timeout_s=60) == 0
            status = await settled(clients[0], user, ["shared", "side"])
            texts = [f.content for f in await store.all_for_user(user)]
            said_after = kept["shared"] + kept["side"]
            counts = {x: sum(t.count(x) for t in texts) for x in said_after}
            back = [x for x in forgotten if any(x in t for t in texts)]
            lost = sum(1 for n in counts.values() if n == 0)
            duplicated = sum(n - 1 for n in counts.values() if n > 1) + len(back)
            assert epochs == [1, 2], epochs
            assert not back, f"{len(back)} lines said before a forget came back: {back[:3]}"
            assert lost == 0, {x: n for x, n in counts.items() if n == 0}
            assert duplicated == 0, {x: n for x, n in counts.items() if n > 1}
            outcome = await said_vs_stored(
                store, user, None, {"after": said_after}, forgotten=forgotten
            )
            assert outcome.clean, outcome
            assert status.forget_epoch == 2 and status.undelivered == 0
            await terminate_started(dev_env.client, task_queue)
    finally:
        for client in clients:
            await client.aclose()
        await store.drop()
        await store.close()
    reliability.record(
        request,
        key=f"randomised-skew-{seed}",
        kind="fault",
        what=f"Seeded random run (seed {seed}): {TURNS} turns by 3 writers with clocks "
        f"{', '.join(f'{s:+.0f} s' for s in SKEWS)} against the worker's (two on one thread); "
        f"the user forgotten before turns {forgets[0]} and {forgets[1]} by a random writer; "
        f"sessions consolidated at {len(consolidations)} random turns; a worker process "
        f"SIGKILLed at turn {kill_at}",
        happened=f"{len(said_after)} lines said after the last forget, each stored once "
        f"(by writer clock: {', '.join(f'{s:+.0f} s {n}' for s, n in by_skew.items())}); "
        f"{len(forgotten)} lines said before it, {len(back)} back; "
        f"{status.refused_stale} messages refused by their epoch",
        outcome=outcome,
        started=started,
    )


async def test_a_turn_said_before_a_forget_by_a_clock_ahead_never_comes_back(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    """An agent whose clock runs 10 s ahead of the worker's starts a turn; its model call is
    slow, and another process forgets the user meanwhile; the turn ends after the forget and
    hands over its line and reply, stamped 10 s ahead (after the forget's time). Both were said
    in a turn that began before the forget: refused. The agent's next turn is kept."""
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"ahead-{uuid.uuid4().hex[:8]}"
        async with mw.memory_client(redis_url) as ahead, mw.memory_client(redis_url) as other:
            mw.track(ahead.workflow_id(user))
            writer = SkewedWriter(ahead, 10.0, HeldModel())
            before = "My first locker is 1187, near the pool."
            said_before = [before, await writer.say(user, "t", before)]
            assert await writer.memory.flush(timeout_s=30) == 0
            secret = "My door code is 4471-XQ, keep it."
            HeldModel.hold, HeldModel.entered = asyncio.Event(), asyncio.Event()
            turn = asyncio.create_task(writer.say(user, "t", secret))
            try:
                await asyncio.wait_for(HeldModel.entered.wait(), 60)
                receipt_ = await other.forget(user, "while the turn runs")
            finally:
                HeldModel.hold.set()
                HeldModel.hold = HeldModel.entered = None
            said_before += [secret, await asyncio.wait_for(turn, 60)]
            assert await writer.memory.flush(timeout_s=30) == 0
            after = "Please ship the order to the Leeds office."
            said_after = [after, await writer.say(user, "t", after)]
            assert await writer.memory.flush(timeout_s=30) == 0
            status = await settled(ahead, user, ["t"])
            texts = [f.content for f in await mw.store.all_for_user(user)]
            back = sum(any(x in t for t in texts) for x in said_before)
            kept = sum(sum(t.count(x) for t in texts) == 1 for x in said_after)
            assert receipt_.epoch == 1 and status.refused_stale >= 2, status
            assert back == 0, texts
            assert kept == len(said_after), texts
            outcome = await said_vs_stored(
                mw.store, user, None, {"t": said_after}, forgotten=said_before
            )
            assert outcome.clean, outcome
    reliability.record(
        request,
        key="forget-during-a-turn-clock-ahead",
        kind="fault",
        what="An agent with its clock 10 s ahead of the worker's starts a turn; another process "
        "forgets the user while the turn's model call runs; the turn then hands its line and "
        "reply over, stamped after the forget's time; then one more turn",
        happened=f"the turn's {len(said_before) - 2} lines carried the epoch read at its start "
        f"and were refused ({status.refused_stale} refused); lines from before the forget back: "
        f"{back}; the next turn kept ({kept} of {len(said_after)} lines)",
        outcome=outcome,
        started=started,
    )


async def test_a_fresh_process_after_redis_lost_the_epoch_key_loses_nothing(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    """The user is forgotten (epoch 1), then Redis loses the epoch key (a flushed or restarted
    cache). A new agent process, which never saw the epoch, reads no key: it must not stamp 0,
    which the workflow would take for "said before the forget" and refuse. Its lines, said
    after the forget by a clock 10 s behind the worker's, are all stored; nothing said before
    the forget comes back."""
    import redis.asyncio as aioredis

    from mnemoflow.models.ids import epoch_key

    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"lostkey-{uuid.uuid4().hex[:8]}"
        async with mw.memory_client(redis_url) as first:
            mw.track(first.workflow_id(user))
            writer = SkewedWriter(first, 0.0)
            before = "My storage cage is 77-B, by the lift."
            said_before = [before, await writer.say(user, "t", before)]
            assert await writer.memory.flush(timeout_s=30) == 0
            await settled(first, user, ["t"])
            receipt_ = await first.forget(user, "user asked")
            assert receipt_.epoch == 1
        cache = aioredis.Redis.from_url(redis_url)
        try:
            assert await cache.delete(epoch_key(mw.read_model.prefix, user)) == 1
        finally:
            await cache.aclose()
        async with mw.memory_client(redis_url) as fresh:  # a new process: saw no epoch
            writer = SkewedWriter(fresh, -10.0)
            said_after: list[str] = []
            for text in ("Ship my parcel to the Leeds office.", "My new cage is 91-C."):
                said_after += [text, await writer.say(user, "t", text)]
            assert await writer.memory.flush(timeout_s=30) == 0
            status = await settled(fresh, user, ["t"])
            outcome = await said_vs_stored(
                mw.store, user, None, {"t": said_after}, forgotten=said_before
            )
    assert outcome.clean, (outcome, status)
    assert status.refused_stale == 0, status
    reliability.record(
        request,
        key="epoch-key-lost-fresh-process",
        kind="fault",
        what="The user forgotten, then Redis lost the forget-epoch key; a new agent process "
        "(clock 10 s behind the worker's) that never saw the epoch says 2 turns",
        happened="the process found no key and stamped no epoch (the time fence judged the "
        f"turns); {len(said_after)} lines said after the forget stored once, "
        f"{status.refused_stale} refused as stale; nothing said before the forget back",
        outcome=outcome,
        started=started,
    )
