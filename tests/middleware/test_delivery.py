"""Nothing said is lost (docs/ARCHITECTURE.md, "Message identity", "Delivery"): what was said is
counted against what is stored, line by line, with distinct content in every turn.

- LangChain's SummarizationMiddleware in the same agent, in either order: it replaces the list
  (summary + the last 4 messages) while memory still has messages to hand over;
- one thread id used by two users (a shared checkpointer): neither user's memory holds the
  other's lines, and recall finds only one's own;
- Temporal down for the last turns, then back, with no further turn: the client's outbox
  delivers in the background, and leaving `async with` (no explicit flush) delivers the rest;
- a seeded random run over 100+ turns: three writers with their own checkpointers (two on one
  thread), summarisation and trimming middleware, the Temporal server stopped and restarted, and
  a worker process killed with SIGKILL, all in the middle.
"""

from __future__ import annotations

import os
import random
import signal
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware, before_model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.models.contracts import UserStatus
from mnemoflow.models.errors import MemoryUnavailableError
from tests.support.chat import ReceiptModel, receipt
from tests.support.drive import eventually
from tests.support.invariants import Outcome, leaked_to, said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.process_stack import process_stack
from tests.support.reliability import Ledger
from tests.support.replay import assert_replays
from tests.support.temporal import restartable_dev_server
from tests.support.worker_process import worker_process

pytestmark = pytest.mark.integration

HOUR = 3600.0


@dataclass
class Ctx:
    user_id: str


class SummaryModel(BaseChatModel):
    """What SummarizationMiddleware calls: a fixed summary (summaries are not memory)."""

    @property
    def _llm_type(self) -> str:
        return "summary"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("Earlier: small talk."))])


def summarizer() -> SummarizationMiddleware:
    return SummarizationMiddleware(SummaryModel(), trigger=("messages", 10), keep=("messages", 4))


@before_model
def keep_last_six(state: Any, runtime: Any) -> dict[str, Any] | None:
    """A trimming middleware as the LangChain docs show it: the graph keeps the last 6."""
    messages = state["messages"]
    if len(messages) <= 6:
        return None
    return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *messages[-6:]]}


def line(rng: random.Random, i: int, who: str) -> str:
    words = ["parcel", "invoice", "garden", "violin", "ferry", "quilt", "lantern", "orchard"]
    tag = f"T{i:03d}-{who}-{rng.getrandbits(32):08x}"
    return f"{tag}: my {rng.choice(words)} is {rng.randint(1, 9999)}."


class Writer:
    """One agent process: its own client, middleware, checkpointer and middleware order."""

    def __init__(self, client: MemoryClient, extra: Sequence[Any], first: bool, t0: float) -> None:
        self.clock = t0
        self.memory = DurableMemoryMiddleware(client=client, clock=lambda: self.clock)
        stack = [self.memory, *extra] if first else [*extra, self.memory]
        self.client = client
        self.agent = create_agent(
            ReceiptModel(), [], middleware=stack, context_schema=Ctx, checkpointer=InMemorySaver()
        )

    async def say(self, user: str, thread: str, text: str) -> str:
        self.clock += 40.0
        config = {"configurable": {"thread_id": thread}}
        result = await self.agent.ainvoke(
            {"messages": [HumanMessage(text)]}, config, context=Ctx(user)
        )
        reply = result["messages"][-1].content
        assert reply == receipt(text), "the turn went on"
        return str(reply)


async def settled(client: MemoryClient, user: str, threads: Sequence[str]) -> UserStatus:
    """Consolidate the threads, then wait (with a deadline) until everything is indexed."""
    for thread in threads:
        await client.consolidate(user, thread)
    status = await client.settle(user, 120)
    assert status is not None
    return status


# --- other middleware rewrites the list ------------------------------------------------------


@pytest.mark.parametrize("memory_first", [True, False], ids=["memory-first", "summary-first"])
async def test_summarisation_in_the_same_agent_loses_nothing(
    memory_first: bool,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random(11 if memory_first else 12)
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"summ-{uuid.uuid4().hex[:8]}"
        async with mw.memory_client(redis_url) as client:
            mw.track(client.workflow_id(user))
            writer = Writer(client, [summarizer()], memory_first, time.time() - 3 * HOUR)
            said: list[str] = []
            for i in range(20):
                text = line(rng, i, "s")
                said += [text, await writer.say(user, "chat", text)]
            state = await writer.agent.aget_state({"configurable": {"thread_id": "chat"}})
            kept = state.values["messages"]
            assert len(kept) < 12 and kept[0].additional_kwargs.get("lc_source") == "summarization"
            assert await writer.memory.flush() == 0
            status = await settled(client, user, ["chat"])
            outcome = await said_vs_stored(mw.store, user, status, {"chat": said})
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
            assert status.watermarks["chat"].accepted == len(said) == 40
    order = "before" if memory_first else "after"
    reliability.record(
        request,
        key=f"summarisation-{order}",
        kind="fault",
        what=f"LangChain SummarizationMiddleware (trigger 10 messages, keep 4) listed {order} "
        "the memory middleware: it replaces the graph's list while messages wait for hand-over",
        happened=f"20 turns, {len(said)} lines said; each reply captured when made, each message "
        f"known by identity; summaries not stored; {outcome.rounds} rounds, {outcome.fragments} "
        "fragments",
        outcome=outcome,
        started=started,
    )


# --- one thread id, two users -----------------------------------------------------------------


async def test_a_thread_id_shared_by_two_users_keeps_their_memories_apart(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    tag = uuid.uuid4().hex[:8]
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        async with mw.memory_client(redis_url) as client:
            users = {"ana": f"ana-{tag}", "ben": f"ben-{tag}"}
            for user in users.values():
                mw.track(client.workflow_id(user))
            writer = Writer(client, [], True, time.time() - 3 * HOUR)  # one checkpointer
            lines = {
                "ana": ["My PIN for the gym locker is 4417.", "My order number is 7734-221."],
                "ben": ["My PIN for the bike shed is 9052.", "My order number is 5550-909."],
            }
            said: dict[str, list[str]] = {"ana": [], "ben": []}
            for i in range(2):
                for who in ("ana", "ben"):
                    text = lines[who][i]
                    said[who] += [text, await writer.say(users[who], "support", text)]
            assert await writer.memory.flush() == 0
            outcomes: list[Outcome] = []
            for who, user in users.items():
                status = await settled(client, user, ["support"])
                outcomes.append(
                    await said_vs_stored(mw.store, user, status, {"support": said[who]})
                )
                other = "ben" if who == "ana" else "ana"
                # The other user's lines under this one: leaked, counted as duplicated.
                outcomes.append(await leaked_to(mw.store, user, said[other]))
                found = await client.recall(user, "PIN order number", top_k=10)
                recalled = " ".join(f.content for f in found.fragments)
                assert all(text not in recalled for text in said[other])
                assert any(text in recalled for text in lines[who])
    outcome = sum(outcomes[1:], outcomes[0])
    assert outcome.clean, outcome
    reliability.record(
        request,
        key="thread-shared-by-users",
        kind="fault",
        what="One thread id (and one checkpointer) used by two users, each stating a PIN and an "
        "order number",
        happened="messages stamped with the owner whose turn added them; each user's memory and "
        "recall hold only their own lines (leaked lines counted as duplicated)",
        outcome=outcome,
        started=started,
    )


# --- delivery that does not wait for the next turn --------------------------------------------


async def test_turns_said_while_temporal_is_down_are_delivered_without_another_turn(
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random(7)
    async with restartable_dev_server(tmp_path) as server:
        temporal = await server.client()
        async with memory_worker(
            temporal, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
        ) as mw:
            user = f"outage-{uuid.uuid4().hex[:8]}"
            said: list[str] = []
            # The README's lifecycle: the client is closed by `async with`, no explicit flush.
            async with mw.memory_client(
                redis_url, signal_timeout_s=2.0, close_timeout_s=60.0
            ) as client:
                mw.track(client.workflow_id(user))
                writer = Writer(client, [], True, time.time() - 3 * HOUR)
                for i in range(2):
                    text = line(rng, i, "up")
                    said += [text, await writer.say(user, "t", text)]
                assert await writer.memory.flush() == 0
                await server.stop()
                for i in range(2, 5):  # the last three turns: Temporal is down, turns go on
                    text = line(rng, i, "down")
                    said += [text, await writer.say(user, "t", text)]
                assert client.outbox.pending(user) == 6

                async def retried() -> bool:
                    return client.outbox.metrics.retries._value.get() >= 1

                await eventually(retried, deadline_s=30, what="a failed delivery attempt")
                assert client.outbox.pending(user) == 6
                await server.start()

                async def delivered() -> bool:  # no further turn: the outbox retries alone
                    return client.outbox.pending(user) < 6

                await eventually(delivered, deadline_s=60, what="background re-delivery")
            # Closed: whatever was left was delivered before the client closed.
            async with mw.memory_client(redis_url) as reader:
                status = await settled(reader, user, ["t"])
                outcome = await said_vs_stored(mw.store, user, status, {"t": said})
                assert status.undelivered == 0 and status.pending_turns == 0
                assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    reliability.record(
        request,
        key="handover-during-outage",
        kind="fault",
        what="The last 3 turns said while the Temporal server was down, then the server back and "
        "no further turn; the client closed by `async with` without an explicit flush",
        happened="the outbox kept the 6 messages and retried with back-off until accepted; the "
        f"close delivered the rest; status: accepted == indexed == {len(said)}, undelivered 0",
        outcome=outcome,
        started=started,
    )


# --- everything at once, seeded ---------------------------------------------------------------

SEED = int(os.environ.get("MNEMOFLOW_TEST_SEED", "20261201"))
TURNS = 105


async def test_randomised_writers_rewrites_outage_and_worker_kill(
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random(SEED)
    outage_at = rng.randint(25, 45)
    outage_turns = rng.randint(4, 8)
    kill_at = rng.randint(outage_at + outage_turns + 5, 85)
    # The outage and the kill can each catch a round holding its workflow task; the task is
    # handed out again once it times out. Temporal's default 10 s instead of the rounds' 55 s
    # (sized for slow local LLM attempts; the offline models take milliseconds): the same
    # recovery, without up to 45 s of waiting per lost task.
    async with process_stack(
        tmp_path, milvus_uri, redis_url, "rand", clients=3, round_task_timeout_s=10.0
    ) as stack:
        server, temporal, store, clients = stack.server, stack.temporal, stack.store, stack.clients
        user, common = f"rand-{stack.tag}", stack.worker_args
        t0 = time.time() - 3 * HOUR
        writers = [
            Writer(clients[0], [summarizer()], True, t0),  # summarises after memory's hooks
            Writer(clients[1], [summarizer()], False, t0 + 1),  # summarises before them
            Writer(clients[2], [keep_last_six], False, t0 + 2),  # trims the graph's list
        ]
        threads = ["shared", "shared", "side"]  # two writers, own checkpointers, one thread
        said: dict[str, list[str]] = {"shared": [], "side": []}
        with (
            worker_process(tmp_path, "victim", **common) as victim,
            worker_process(tmp_path, "survivor", **common),
        ):
            for i in range(TURNS):
                if i == outage_at:
                    await server.stop()
                if i == outage_at + outage_turns:
                    await server.start()
                if i == kill_at:
                    os.kill(victim.pid, signal.SIGKILL)
                w = rng.randrange(3)
                text = line(rng, i, f"w{w}")
                said[threads[w]] += [text, await writers[w].say(user, threads[w], text)]
            for writer in writers:
                await writer.memory.flush(timeout_s=60)
            for client in clients:
                assert client.outbox.pending() == 0
            try:
                status = await settled(clients[0], user, ["shared", "side"])
            except MemoryUnavailableError as err:  # pragma: no cover - shows what is pending
                pytest.fail(f"memory never settled: {err}")
            outcome = await said_vs_stored(store, user, status, said)
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
            total = sum(len(v) for v in said.values())
            assert sum(m.accepted for m in status.watermarks.values()) == total
            await temporal.get_workflow_handle(clients[0].workflow_id(user)).terminate("test over")
    reliability.record(
        request,
        key="randomised-delivery",
        kind="fault",
        what=f"Seeded random run (seed {SEED}): {TURNS} turns by 3 writers with their own "
        "checkpointers (two on one thread), summarisation before and after memory, a trimming "
        f"middleware; the Temporal server down for turns {outage_at}-{outage_at + outage_turns - 1}"
        f"; a worker process SIGKILLed at turn {kill_at}",
        happened=f"{total} lines said, each stored once; {outcome.rounds} rounds, "
        f"{outcome.fragments} fragments; said == accepted == indexed",
        outcome=outcome,
        started=started,
    )


async def test_a_message_said_before_a_forget_is_never_indexed_after_it(
    milvus_uri: str,
    redis_url: str,
    tmp_path: Path,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with restartable_dev_server(tmp_path) as server:
        temporal = await server.client()
        async with memory_worker(
            temporal, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
        ) as mw:
            user = f"fence-{uuid.uuid4().hex[:8]}"
            async with mw.memory_client(redis_url, signal_timeout_s=2.0) as client:
                mw.track(client.workflow_id(user))
                writer = Writer(client, [], True, time.time() - 3 * HOUR)
                await writer.say(user, "t", "Hello, I am new here.")
                assert await writer.memory.flush() == 0
                await server.stop()
                secret = "My door code is 4471-XQ, keep it."
                await writer.say(user, "t", secret)  # said while Temporal is down
                await server.start()
                # The writer's clock stays three hours behind the worker's: the fence is the
                # forget epoch, not a comparison of clocks (docs/ARCHITECTURE.md, "Forget
                # epochs").
                assert writer.clock < time.time() - HOUR
                receipt = await client.forget(user, "user asked")
                after = "Please send the invoice to accounts."
                said_after = [after, await writer.say(user, "t", after)]
                assert await writer.memory.flush(timeout_s=60) == 0
                status = await settled(client, user, ["t"])
                # What was said before the forget is in no row; what came after, once.
                outcome = await said_vs_stored(
                    mw.store, user, status, {"t": said_after}, forgotten=["4471-XQ", "new here"]
                )
                assert outcome.clean and receipt.epoch == 1, outcome
                assert status.watermarks["t"].indexed == status.watermarks["t"].accepted
                # Stamped turns and a forget with epochs replay (patch forget-epochs).
                await assert_replays(temporal, [client.workflow_id(user)], name="forget-epochs")
    reliability.record(
        request,
        key="forget-fence",
        kind="fault",
        what="A message said while the Temporal server was down, the server back, the user "
        "forgotten, then one more turn (which offers the unaccepted message again)",
        happened="the forget's epoch refused every message said before it, however late it "
        f"arrived; the turn after the forget was stored ({len(said_after)} lines), nothing "
        "from before; the agent's clock 3 h behind the worker's",
        outcome=outcome,
        started=started,
    )
