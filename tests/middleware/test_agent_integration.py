"""DurableMemoryMiddleware through `create_agent`, on the dev server with the real worker, Redis and
Milvus Lite, and a scripted chat model that records what it was sent.

Messages are stamped by a virtual clock that starts hours ago, so the production gate values
apply and rounds are due as soon as messages arrive; every wait is a condition with a deadline.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import free_port
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient, memory_tools
from mnemoflow.middleware.durable_memory import accepted_key
from mnemoflow.middleware.window import message_identity
from mnemoflow.models.config import BudgetPattern, MemoryConfig
from mnemoflow.models.ids import user_workflow_id
from tests.support.drive import eventually
from tests.support.memory_worker import MemoryWorker, memory_worker

pytestmark = pytest.mark.integration

CORE = "You are the shop's assistant."
#: A small message budget, so trimming would show if it happened.
CFG = MemoryConfig(pattern=BudgetPattern.MESSAGES, trigger_threshold=6)
FACTS = [
    "Hi, my name is Ada Lovelace and I work as a data engineer.",
    "My order number is 7734-221 and it has not arrived yet.",
    "I prefer email over phone calls, and I am busy on Wednesdays.",
    "Can you check the delivery date of my order?",
]


@dataclass
class Ctx:
    """The agent's runtime context."""

    user_id: str


class VirtualClock:
    """Starts three hours ago and advances 35 s per reading (the predecessor's pacing)."""

    def __init__(self) -> None:
        self.t = time.time() - 3 * 3600

    def __call__(self) -> float:
        self.t += 35.0
        return self.t


class ScriptedModel(BaseChatModel):
    """Answers from a script (then "ok n"), recording every request it receives."""

    script: list[AIMessage] = Field(default_factory=list)
    seen: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        reply = self.script.pop(0) if self.script else AIMessage(f"ok {len(self.seen)}")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def system_prompt(self, call: int = -1) -> str:
        first = self.seen[call][0]
        return str(first.content) if first.type == "system" else ""


@dataclass
class Harness:
    """An agent with the middleware mounted as the README shows, and what drives it."""

    agent: Any
    mw: DurableMemoryMiddleware
    model: ScriptedModel
    clock: VirtualClock

    async def turn(self, user: str, thread: str, text: str) -> dict[str, Any]:
        message = HumanMessage(text, additional_kwargs={"time": self.clock()})
        return await self.agent.ainvoke(
            {"messages": [message]}, {"configurable": {"thread_id": thread}}, context=Ctx(user)
        )

    async def state(self, thread: str) -> dict[str, Any]:
        snapshot = await self.agent.aget_state({"configurable": {"thread_id": thread}})
        return dict(snapshot.values)


def harness(
    client: MemoryClient,
    *,
    tools: Sequence[Any] = (),
    saver: Any = None,
    model: ScriptedModel | None = None,
    clock: VirtualClock | None = None,
    remember: bool = True,
) -> Harness:
    model = model or ScriptedModel()
    clock = clock or VirtualClock()
    mw = DurableMemoryMiddleware(client=client, core_prompt=CORE, clock=clock, remember=remember)
    agent = create_agent(
        model,
        list(tools),
        middleware=[mw],
        context_schema=Ctx,
        checkpointer=saver or InMemorySaver(),
    )
    return Harness(agent, mw, model, clock)


@pytest.fixture
def env(dev_env: WorkflowEnvironment) -> WorkflowEnvironment:
    """The session's dev server (imported above, so this module needs no conftest)."""
    return dev_env


def new_user(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def stack(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str, models: Any = None, **client_kw: Any
) -> AsyncIterator[tuple[MemoryWorker, MemoryClient]]:
    """A memory worker on its own task queue and a MemoryClient wired to it."""
    async with memory_worker(
        env.client,
        milvus_uri=milvus_uri,
        redis_url=redis_url,
        models=models or HeuristicMemoryModels(),
    ) as mw:
        options: dict[str, Any] = {
            "redis": redis_url,
            "key_prefix": mw.read_model.prefix,
            "task_queue": mw.task_queue,
            "config": CFG,
            # the per-call search served by the worker's Milvus, as production clients have it
            "milvus_uri": milvus_uri,
            "milvus_collection": mw.store.collection,
        }
        options.update(client_kw)
        client = MemoryClient(temporal=env.client, **options)
        try:
            yield mw, client
        finally:
            await client.aclose()


def accepted_count(state: dict[str, Any], user: str, thread: str) -> int:
    """How many of the thread's messages the state records as accepted by the workflow."""
    record = state.get("memory_accepted", {}).get(accepted_key(user, thread))
    if not record:
        return 0
    ids = [message_identity(m) for m in state["messages"]]
    head = ids.index(record["upto"]) + 1 if record["upto"] in ids else 0
    return head + len(record["more"])


async def wait_indexed(client: MemoryClient, user: str, thread: str, end: int) -> None:
    """Until the thread's messages [0, end) are in Milvus and the workflow is idle.

    Idle includes induction: fragments are as old as their messages (hours, by the virtual
    clock), so their induction is due right after the round.
    """

    async def done() -> bool:
        status = await client.status(user)
        if status is None or thread not in status.watermarks:
            return False
        finished = status.rounds_completed + status.rounds_failed
        return (
            status.watermarks[thread].indexed >= end
            and finished == status.rounds_started
            and status.uninducted == 0
        )

    await eventually(done, deadline_s=60, what=f"{thread} indexed to {end}")


async def assert_covered_once(
    mw: MemoryWorker, client: MemoryClient, user: str, thread: str, end: int
) -> None:
    """Every position of the thread was sliced by exactly one round; fragment ids are unique."""
    status = await client.status(user)
    assert status is not None
    ranges = sorted(
        (r.start, r.end) for r in status.rounds if r.thread_id == thread and r.status == "completed"
    )
    covered = [p for start, stop in ranges for p in range(start, stop)]
    assert covered == list(range(end)), f"rounds {ranges} must cover 0..{end} once"
    fragments = await mw.store.all_for_user(user)
    assert fragments and len({f.id for f in fragments}) == len(fragments)
    assert await mw.store.count(user) == len(fragments)


async def test_state_survives_and_nothing_is_handed_over_twice(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    async with stack(env, milvus_uri, redis_url) as (mw, client):
        h, user, thread = harness(client), new_user("a"), "thread-a"
        accepted = []
        for text in FACTS:
            await h.turn(user, thread, text)
            await h.mw.flush()
            accepted.append(accepted_count(await h.state(thread), user, thread))
        # Each turn records what the previous turn's background hand-over got accepted.
        assert accepted == [0, 2, 4, 6]
        await h.turn(user, thread, "Thanks, that is all.")
        await h.mw.flush()
        assert accepted_count(await h.state(thread), user, thread) == 8
        await wait_indexed(client, user, thread, 10)
        await assert_covered_once(mw, client, user, thread, 10)
        assert all("time" in m.additional_kwargs for m in (await h.state(thread))["messages"]), (
            "every message is stamped in the checkpointed state"
        )


async def test_no_memory_model_call_happens_inside_a_turn(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    models = HeuristicMemoryModels(latency_s=0.8)
    async with stack(env, milvus_uri, redis_url, models=models) as (_, client):
        h, user, thread = harness(client), new_user("b"), "thread-b"
        in_turn = 0
        for i, text in enumerate(FACTS[:3]):
            before = sum(models.calls.values())
            await h.turn(user, thread, text)
            in_turn += sum(models.calls.values()) - before
            await h.mw.flush()
            # Let the round of this turn finish, so the next count sees only the next turn.
            await wait_indexed(client, user, thread, 2 * i + 2)
        assert in_turn == 0
        assert models.calls["slice"] >= 1, "the memory work did happen, off the turn"


async def test_temporal_down_then_up_hands_everything_over(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    async with stack(env, milvus_uri, redis_url) as (mw, client):
        dead = await Client.connect(
            f"127.0.0.1:{free_port()}", lazy=True, data_converter=env.client.data_converter
        )
        down = MemoryClient(
            temporal=dead,
            task_queue=mw.task_queue,
            redis=redis_url,
            key_prefix=mw.read_model.prefix,
            config=CFG,
            close_timeout_s=0.2,
        )
        saver, user, thread = InMemorySaver(), new_user("c"), "thread-c"
        h = harness(down, saver=saver)
        for text in [*FACTS, "One more thing.", "And another."]:
            await h.turn(user, thread, text)
        assert await h.mw.flush(timeout_s=0.2) == 12  # kept, retried, never delivered
        await down.aclose()
        # Over the budget, yet nothing trimmed: without memory nothing is known to be indexed.
        assert [len(call) for call in h.model.seen] == [2 * i + 2 for i in range(6)]
        assert accepted_count(await h.state(thread), user, thread) == 0

        up = harness(client, saver=saver, clock=h.clock)
        await up.turn(user, thread, "Is my order on its way?")
        await up.mw.flush()
        await wait_indexed(client, user, thread, 14)
        await assert_covered_once(mw, client, user, thread, 14)
        human = {i for i, m in enumerate((await up.state(thread))["messages"]) if m.type == "human"}
        spans = [(f.start_pos, f.end_pos) for f in await mw.store.all_for_user(user)]
        assert all(any(s <= p < e for s, e in spans) for p in human), "every human line kept"


async def test_redis_down_uses_the_query_fallback(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    async with stack(env, milvus_uri, redis_url, redis=dead_redis) as (_, client):
        h, user = harness(client), new_user("d")
        for text in FACTS[:2]:
            await h.turn(user, "first", text)
        await h.mw.flush()
        await h.turn(user, "first", "ok")
        await h.mw.flush()
        await wait_indexed(client, user, "first", 6)
        await h.turn(user, "second", "What do you know about me?")
        assert "7734-221" in h.model.system_prompt(), "memory came through the query"


async def test_no_worker_gives_the_no_memory_fallback_in_time(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    client = MemoryClient(
        temporal=env.client,
        task_queue=f"nobody-{uuid.uuid4().hex[:8]}",
        redis=redis_url,
        config=CFG,
        query_timeout_s=0.5,
    )
    h, user, thread = harness(client), new_user("e"), "thread-e"
    try:
        for text in FACTS[:3]:
            started = time.monotonic()
            await h.turn(user, thread, text)
            # One model call per turn, so at most one bounded query fallback (0.5 s). The margin
            # is for a loaded machine; an unbounded query would block for about 30 s.
            assert time.monotonic() - started < 0.5 + 8.0
            await h.mw.flush()
        assert all(h.model.system_prompt(i) == CORE for i in range(3))
        # Temporal accepted the hand-overs although no worker runs them.
        assert accepted_count(await h.state(thread), user, thread) == 4
    finally:
        await env.client.get_workflow_handle(user_workflow_id(user)).terminate("test over")
        await client.aclose()


async def test_cross_session_recall_for_the_same_user_only(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    async with stack(env, milvus_uri, redis_url) as (_, client):
        h, ada, bob = harness(client), new_user("ada"), new_user("bob")
        for text in FACTS:
            await h.turn(ada, "session-1", text)
        await h.turn(bob, "bob-1", "Hello, my name is Bob Stone and my order is 5550-909.")
        await h.mw.flush()
        await h.turn(ada, "session-1", "Bye.")
        await h.turn(bob, "bob-1", "Bye.")
        await h.mw.flush()
        await wait_indexed(client, ada, "session-1", 10)
        await wait_indexed(client, bob, "bob-1", 4)

        await h.turn(ada, "session-2", "Hello again, any news?")
        ada_prompt = h.model.system_prompt()
        assert ada_prompt.startswith(CORE)
        assert "7734-221" in ada_prompt and "5550-909" not in ada_prompt
        await h.turn(bob, "bob-2", "Hi, it is me again.")
        bob_prompt = h.model.system_prompt()
        assert "5550-909" in bob_prompt and "7734-221" not in bob_prompt
        assert "Ada" not in bob_prompt


def tool_call(name: str, args: dict[str, Any]) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[{"name": name, "args": args, "id": uuid.uuid4().hex[:8], "type": "tool_call"}],
    )


async def test_tools_are_bound_to_the_runs_user(
    env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
) -> None:
    async with stack(env, milvus_uri, redis_url) as (mw, client):
        xavier, yvonne = new_user("x"), new_user("y")
        theirs = await client.remember(yvonne, "Yvonne's locker code is 9090.")
        model = ScriptedModel(
            script=[
                tool_call("remember_this", {"text": "Xavier's locker code is 4512."}),
                AIMessage("Noted."),
                tool_call("recall_memories", {"query": "locker code"}),
                AIMessage("Found it."),
                tool_call("forget_memory", {"fragment_id": theirs.fragment_id}),
                AIMessage("Done."),
                tool_call("memory_stats", {}),
                AIMessage("Here are the stats."),
            ]
        )
        h = harness(client, tools=memory_tools(client), model=model)
        for text in [
            "Remember my locker code 4512.",
            "What is my locker code?",
            "Forget that other memory.",
            "How much do you remember?",
        ]:
            await h.turn(xavier, "tools", text)
        await h.mw.flush()
        results = [
            m.content for m in (await h.state("tools"))["messages"] if isinstance(m, ToolMessage)
        ]
        assert results[0].startswith("Remembered")
        assert "4512" in results[1] and "9090" not in results[1]
        assert results[2].startswith("No memory with id")
        assert "rounds completed" in results[3]
        assert [f.id for f in await mw.store.get(yvonne, [theirs.fragment_id])] == [
            theirs.fragment_id
        ], "another user's fragment is untouched"
        recalled = await client.recall(yvonne, "locker code")
        assert any("9090" in f.content for f in recalled.fragments)
        assert not any("4512" in f.content for f in recalled.fragments)


async def test_structured_answers_and_tool_arguments_are_memory(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """An agent with `response_format` (a tool strategy) answers by a tool call: its arguments
    are the answer, and they were stored as '[tool call: Ticket]' only. Each turn's answer is
    distinct, and each is stored once; a memory tool's own call keeps its name only."""
    from pydantic import BaseModel

    class Ticket(BaseModel):
        summary: str
        priority: int

    humans = [f"My router X{i * 37 + 5} drops the wifi every {i + 2} hours." for i in range(3)]
    answers = [
        {"summary": f"Router X{i * 37 + 5} unstable, case R-{7100 + i}", "priority": i + 1}
        for i in range(3)
    ]
    async with stack(env, milvus_uri, redis_url) as (mw, client):
        user = new_user("structured")
        mw.track(client.workflow_id(user))
        model = ScriptedModel(script=[tool_call("Ticket", a) for a in answers])
        memory = DurableMemoryMiddleware(client=client, core_prompt=CORE, clock=VirtualClock())
        agent = create_agent(
            model,
            [],
            middleware=[memory],
            context_schema=Ctx,
            checkpointer=InMemorySaver(),
            response_format=Ticket,
        )
        cfg = {"configurable": {"thread_id": "tickets"}}
        got = [
            (await agent.ainvoke({"messages": [HumanMessage(h)]}, cfg, context=Ctx(user)))[
                "structured_response"
            ]
            for h in humans
        ]
        assert [t.summary for t in got] == [a["summary"] for a in answers]
        await memory.flush()
        await client.consolidate(user, "tickets")
        await client.settle(user, 120)
        texts = [f.content for f in await mw.store.all_for_user(user)]
        for line in humans + [f"R-{7100 + i}" for i in range(3)]:
            assert sum(t.count(line) for t in texts) == 1, (line, texts)
