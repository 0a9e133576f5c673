"""A forget made by another client of the same user (another agent process, an operator) is
honoured by every agent once it has returned (README, "How memory is chosen for a call"):

- a turn that began before the forget searched the corpus early; its model calls after the
  forget see the corpus version move past a delete and search again (a round's writes alone
  move it too, and the search is not run again for them: what it found is still stored);
- an agent that serves the workflow's answer after a clean Redis miss (Redis lost the user's
  keys) checks that answer against a corpus version it started itself, which the forget deletes.

Two MemoryClients stand for two agent processes: each has its own search cache and reader. Every
user's details are distinct, and what was not forgotten must still be injected.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.corpus import corpus_key, corpus_version_key
from mnemoflow.models.ids import context_key
from mnemoflow.models.turns import ChatTurn
from tests.middleware.test_agent_integration import ScriptedModel
from tests.support.drive import eventually
from tests.support.memory_worker import memory_worker

#: Generous, so that a loaded machine never falls back to the published context by timeout.
CONFIG = MemoryConfig(search_deadline_s=3.0)
DAY = 86400.0


@dataclass
class Ctx:
    user_id: str


def detail(user: str, n: int) -> str:
    return f"The gate code of storage unit {user}-{n} is {7100 + 13 * n}, pass word ember{n}."


def marks(user: str, n: int) -> list[str]:
    """What only detail n of `user` says."""
    return [f"unit {user}-{n} ", f"{7100 + 13 * n},", f"ember{n}."]


def shows(prompt: str, user: str, n: int) -> list[str]:
    return [m for m in marks(user, n) if m in prompt]


class Agent:
    """An agent of its own process: its own client, model, middleware and checkpointer."""

    def __init__(self, client: MemoryClient, tools: list[Any] | None = None) -> None:
        self.model = ScriptedModel()
        self.memory = DurableMemoryMiddleware(client=client, core_prompt="You keep storage units.")
        self.agent = create_agent(
            self.model,
            tools or [],
            middleware=[self.memory],
            context_schema=Ctx,
            checkpointer=InMemorySaver(),
        )

    async def ask(self, user: str, thread: str, question: str) -> list[str]:
        """The system prompts of the model calls of one turn."""
        before = len(self.model.seen)
        await self.agent.ainvoke(
            {"messages": [HumanMessage(content=question)]},
            config={"configurable": {"thread_id": thread}},
            context=Ctx(user_id=user),
        )
        return [self.model.system_prompt(i) for i in range(before, len(self.model.seen))]

    def calls_tool_first(self, name: str) -> None:
        call = {"name": name, "args": {"ref": "r1"}, "id": "call-1", "type": "tool_call"}
        self.model.script = [AIMessage("", tool_calls=[call])]


async def remembered(mw: Any, redis_url: str, user: str) -> tuple[MemoryClient, MemoryClient]:
    """Two clients of the user (the caller closes them), after three threads, each telling one
    detail, were stored and inducted."""
    first = mw.memory_client(redis_url, config=CONFIG, embeddings=HashingEmbeddings())
    second = mw.memory_client(redis_url, config=CONFIG, embeddings=HashingEmbeddings())
    mw.track(first.workflow_id(user))
    t0 = time.time() - 5 * DAY
    for n in (1, 2, 3):
        said = [
            detail(user, n),
            f"Noted for unit {n}.",
            f"Also, the lift on floor {n + 3} of block {user}-{n} squeaks.",
            f"I will report the lift on floor {n + 3}.",
        ]
        turns = [
            ChatTurn(
                thread_id=f"told-{n}",
                position=i,
                role="human" if i % 2 == 0 else "ai",
                content=text,
                time=t0 + n * DAY + 30 * i,
            )
            for i, text in enumerate(said)
        ]
        await first.submit(user, turns, urgent=True)

    async def stored() -> bool:
        status = await first.status(user)
        if status is None or status.pending_turns:
            return False
        marks_ = [status.watermarks.get(f"told-{n}") for n in (1, 2, 3)]
        return all(m is not None and m.indexed >= 4 for m in marks_)

    await eventually(stored, deadline_s=90, what="the three threads stored")
    await first.settle(user, timeout_s=60, inducted=True)
    return first, second


@asynccontextmanager
async def two_clients(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> AsyncIterator[tuple[Any, str, MemoryClient, MemoryClient]]:
    """(worker, user, another client, this agent's client), the user's details remembered."""
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user = f"u{uuid.uuid4().hex[:8]}"
        other, client = await remembered(mw, redis_url, user)
        try:
            yield mw, user, other, client
        finally:
            await other.aclose()
            await client.aclose()


async def test_a_turn_begun_before_another_clients_forget_does_not_inject_it_after(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):
        rows = [f for f in await mw.store.all_for_user(user) if shows(f.content, user, 2)]
        assert rows, "detail 2 was not stored: nothing to forget"

        @tool
        async def check_unit(ref: str) -> str:
            """Look a unit up (meanwhile another client forgets detail 2)."""
            for row in rows:
                assert (await other.forget_fragment(user, row.id)).deleted == 1
            return f"unit {ref}: in use"

        agent = Agent(client, [check_unit])
        agent.calls_tool_first("check_unit")
        searches = counted_searches(client)
        asked = f"What is the gate code of storage unit {user}-2?"
        prompts = await agent.ask(user, "asks", asked)
        assert len(prompts) == 2, prompts
        assert len(searches) == 2, "the model call after the forget did not search again"
        assert shows(prompts[0], user, 2), "detail 2 not injected before the forget"
        assert not shows(prompts[1], user, 2), prompts[1]
        # what was not forgotten is still found
        kept = await agent.ask(user, "asks", f"What is the gate code of storage unit {user}-3?")
        assert shows(kept[0], user, 3), kept[0]
        assert not any(f for f in await mw.store.all_for_user(user) if shows(f.content, user, 2))
        await agent.memory.flush()


async def test_a_rounds_writes_during_a_turn_do_not_make_its_calls_search_again(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):
        version = corpus_version_key(mw.read_model.prefix, user)
        redis = mw.read_model.redis

        @tool
        async def check_unit(ref: str) -> str:
            """Look a unit up (meanwhile another client's round stores detail 4)."""
            before = int(await redis.get(version))
            said = detail(user, 4)
            turn = ChatTurn(
                thread_id="told-4", position=0, role="human", content=said, time=time.time()
            )
            await other.submit(user, [turn], urgent=True)

            async def moved() -> bool:
                return int(await redis.get(version) or 0) > before

            await eventually(moved, deadline_s=60, what="the round's write moved the version")
            return f"unit {ref}: in use"

        agent = Agent(client, [check_unit])
        agent.calls_tool_first("check_unit")
        searches = counted_searches(client)
        prompts = await agent.ask(user, "asks", f"What is the gate code of unit {user}-2?")
        assert len(prompts) == 2, prompts
        assert len(searches) == 1, "a round's writes alone made the turn search again"
        assert shows(prompts[1], user, 2), prompts[1]
        assert any(shows(f.content, user, 4) for f in await mw.store.all_for_user(user))
        await agent.memory.flush()


def counted_searches(client: MemoryClient) -> list[str]:
    """The questions the client is asked to search for, from now on."""
    asked: list[str] = []
    search = client.search

    async def counted(user_id: str, query: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(query)
        return await search(user_id, query, *args, **kwargs)

    client.search = counted  # type: ignore[method-assign]
    return asked


async def test_a_turn_begun_before_another_clients_whole_forget_injects_nothing_after(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):

        @tool
        async def check_unit(ref: str) -> str:
            """Look a unit up (meanwhile another client forgets the user)."""
            await other.forget(user, reason="test")
            return f"unit {ref}: in use"

        agent = Agent(client, [check_unit])
        agent.calls_tool_first("check_unit")
        prompts = await agent.ask(user, "asks", f"What is the gate code of unit {user}-1?")
        assert len(prompts) == 2, prompts
        assert shows(prompts[0], user, 1), "detail 1 not injected before the forget"
        assert await mw.store.all_for_user(user) == []
        left = {n: shows(prompts[1], user, n) for n in (1, 2, 3)}
        assert not any(left.values()), left
        await agent.memory.flush()


async def test_an_answer_served_while_redis_lost_the_user_is_dropped_by_a_forget(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):
        prefix, redis = mw.read_model.prefix, mw.read_model.redis
        keys: Callable[[], list[str]] = lambda: [  # noqa: E731
            context_key(prefix, user),
            corpus_key(prefix, user),
            corpus_version_key(prefix, user),
        ]
        await redis.delete(*keys())  # Redis lost the user's keys (a restart, an eviction)
        agent = Agent(client)
        asked = f"What is the gate code of storage unit {user}-1?"
        await agent.ask(user, "before", asked)  # a clean miss: the workflow is asked aside

        async def served() -> bool:
            return bool(shows((await agent.ask(user, "before", asked))[0], user, 1))

        await eventually(served, deadline_s=30, what="the workflow's answer served")
        await other.forget(user, reason="test")
        prompts = await agent.ask(user, "after", asked)
        assert not any(shows(prompts[0], user, n) for n in (1, 2, 3)), prompts[0]
        await agent.memory.flush()
