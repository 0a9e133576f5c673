"""Two agent processes serving the same user at once, and the same turn submitted twice, on the
dev server with the real worker, Redis and Milvus Lite.

Each "process" has its own MemoryClient, DurableMemoryMiddleware and checkpointer; both hold the
same thread with the same messages, so their hand-overs overlap position for position. The user
workflow recognises every position once: each message is indexed exactly once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.window import to_turns
from mnemoflow.models.ids import user_workflow_id
from tests.support.drive import eventually
from tests.support.invariants import Monotonic, indexed_once
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

LINES = [
    "Hi, I'm Ada Lovelace, a data engineer.",
    "My order number is 7734-221 and it is late.",
    "I prefer email, and I'm busy on Wednesdays.",
    "My cat is called Pixel.",
]


@dataclass
class Ctx:
    user_id: str


class EchoModel(BaseChatModel):
    """Answers "noted: <last human text>", the same in every process for the same input."""

    @property
    def _llm_type(self) -> str:
        return "echo"

    def bind_tools(self, tools: Any, **kwargs: Any) -> EchoModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last = next(m for m in reversed(messages) if m.type == "human")
        reply = AIMessage(f"noted: {last.content}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def test_two_agent_processes_same_user_same_thread(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user, thread = f"twin-{uuid.uuid4().hex[:8]}", "shared"
        mw.track(user_workflow_id(user))
        clients = [MemoryClient(temporal=dev_env.client, task_queue=mw.task_queue) for _ in "ab"]
        t0 = time.time() - 3 * 3600
        agents = []
        for client in clients:
            # Same clock in both processes: the same message gets the same stamp.
            middleware = DurableMemoryMiddleware(client=client, clock=lambda: t0)
            agent = create_agent(
                EchoModel(), [], middleware=[middleware], context_schema=Ctx,
                checkpointer=InMemorySaver(),
            )  # fmt: skip
            agents.append((agent, middleware))
        config = {"configurable": {"thread_id": thread}}
        for i, text in enumerate(LINES):
            stamp = {"time": t0 + 70 * i}
            results = await asyncio.gather(
                *(
                    agent.ainvoke(
                        {"messages": [HumanMessage(text, additional_kwargs=stamp)]},
                        config,
                        context=Ctx(user),
                    )
                    for agent, _ in agents
                )
            )
            assert all(r["messages"][-1].content == f"noted: {text}" for r in results)
        for _, middleware in agents:
            await middleware.flush()
        total = 2 * len(LINES)
        watch = Monotonic()

        async def indexed() -> bool:
            s = await clients[0].status(user)
            return bool(s and watch.see(s) and s.watermarks[thread].indexed == total)

        await eventually(indexed, deadline_s=60, what="both processes' turns indexed")
        before = await clients[0].status(user)
        assert before is not None
        # The same turn submitted twice more (a retried hand-over): nothing new happens.
        state = await agents[1][0].aget_state(config)
        turns = to_turns(state.values["messages"], thread, 0, t0)
        await clients[1].submit(user, turns)
        await clients[1].submit(user, turns[-2:])
        after = await clients[1].settle(user, 30)  # the re-sends absorbed
        assert after is not None and watch.see(after)
        assert after.rounds_started == before.rounds_started and after.pending_turns == 0
        outcome = await indexed_once(mw.store, user, after, {thread: total})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
        for client in clients:
            await client.aclose()
    reliability.record(
        request,
        key="two-agent-processes",
        kind="fault",
        what="Two agent processes (own MemoryClient, middleware, checkpointer) serving the same "
        "user and thread at once; then the same turns submitted twice more",
        happened=f"overlapping hand-overs deduplicated by thread position; {outcome.rounds} "
        f"rounds, {outcome.fragments} fragments; re-sends started no round; every turn of both "
        "agents answered",
        lost=outcome.lost,
        duplicated=outcome.duplicated,
        started=started,
    )
