"""A message with no owner stamp belongs to whoever's turn added it, or to nobody: never to every
user of a shared thread (docs/ARCHITECTURE.md, "Message identity", ownership).

Two users take turns on one thread id (one checkpointer), and another middleware adds a message
of its own to every turn, after the memory middleware's last hook saw the list (its
`after_agent` runs after ours) or before (it runs first). Each note names the user and the turn,
so a note stored in the other user's memory is counted as a leak. A restarted process then
re-sends the thread from the checkpointer for each user (`resync`): the last turn's note has no
owner stamp and follows the other user's message.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware
from tests.middleware.test_delivery import Ctx, settled
from tests.support.chat import ReceiptModel, receipt
from tests.support.invariants import leaked_to, no_messages, said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

HOUR = 3600.0


class TurnNotes(AgentMiddleware[Any, Any, Any]):
    """Other middleware: adds a note of the turn, without any of memory's stamps, after the
    agent ran (a session log, a disclaimer)."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[tuple[str, str]] = []  # (user id, note)

    async def aafter_agent(self, state: Any, runtime: Any) -> dict[str, Any] | None:
        user = runtime.context.user_id
        note = f"Service note {len(self.added) + 1} for {user}: case {uuid.uuid4().hex[:10]}."
        self.added.append((user, note))
        return {"messages": [AIMessage(note)]}


@pytest.mark.parametrize("memory_first", [True, False], ids=["notes-after", "notes-before"])
async def test_unstamped_messages_of_other_middleware_never_reach_another_user(
    memory_first: bool,
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
            clock = [time.time() - 3 * HOUR]
            memory = DurableMemoryMiddleware(client=client, clock=lambda: clock[0])
            notes = TurnNotes()
            # after_agent hooks run in reverse order: [memory, notes] runs the notes first
            stack = [memory, notes] if memory_first else [notes, memory]
            agent = create_agent(
                ReceiptModel(),
                [],
                middleware=stack,
                context_schema=Ctx,
                checkpointer=InMemorySaver(),
            )
            config = {"configurable": {"thread_id": "desk"}}
            said: dict[str, list[str]] = {"ana": [], "ben": []}
            for i in range(3):
                for who in ("ana", "ben"):
                    clock[0] += 40.0
                    text = f"{who} turn {i}: my parcel locker code is {tag}-{who}-{i}."
                    await agent.ainvoke(
                        {"messages": [HumanMessage(text)]}, config, context=Ctx(users[who])
                    )
                    said[who] += [text, receipt(text)]
            assert await memory.flush() == 0
            # A process restarts and re-sends the thread from the checkpointer, for each user
            # (README: `resync(user, thread, state.values["messages"])`).
            restored = (await agent.aget_state(config)).values["messages"]
            for user in users.values():
                await client.resync(user, "desk", restored)
            note_of = {users[k]: k for k in users}
            mine = {who: [n for u, n in notes.added if note_of[u] == who] for who in users}
            leaked = 0
            outcome = no_messages()
            for who, user in users.items():
                status = await settled(client, user, ["desk"])
                other = "ben" if who == "ana" else "ana"
                stored = " ".join(f.content for f in await mw.store.all_for_user(user))
                leaked += sum(t in stored for t in said[other] + mine[other])
                outcome += await said_vs_stored(mw.store, user, status, {"desk": said[who]})
                outcome += await leaked_to(mw.store, user, said[other] + mine[other])
    assert leaked == 0, f"{leaked} lines of one user stored in the other's memory"
    assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    reliability.record(
        request,
        key=f"unstamped-other-middleware-{'after' if memory_first else 'before'}",
        kind="fault",
        what="Two users on one thread id, 3 turns each; another middleware adds an unstamped "
        f"note to every turn ({'before' if memory_first else 'after'} memory's last hook sees "
        "the list), then the thread is re-sent from the checkpointer (`resync`) for each user",
        happened=f"no line or note of one user in the other's memory ({leaked} leaked); every "
        "line each user said stored once",
        outcome=outcome,
        started=started,
    )
