"""Turns at the edges of what an app sends, on the dev server with the real worker, Redis and
Milvus Lite: a failed turn on a thread id two users share, lone surrogates in ids, a message id
reused for every turn, a caller's time stamp of 0, a sub-agent run inside a tool, a sync invoke.

Each counts what was said against what each user's memory stored (every line distinct).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.tools import ToolRuntime
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.durable_memory import SyncRunError
from mnemoflow.middleware.window import NESTED_SEPARATOR
from mnemoflow.models.contracts import UserStatus
from mnemoflow.models.ids import thread_key
from tests.middleware.conftest import LiveMemory
from tests.support.chat import ReceiptModel, receipt

pytestmark = pytest.mark.integration

HOUR = 3600.0


@dataclass
class Ctx:
    user_id: Any


class Clock:
    """Advances 7 s a call, from three hours ago (every stamp distinct, all in the past)."""

    def __init__(self) -> None:
        import time

        self.t = time.time() - 3 * HOUR

    def __call__(self) -> float:
        self.t += 7.0
        return self.t


def _human(messages: list[BaseMessage]) -> str:
    return next(str(m.content) for m in reversed(messages) if m.type == "human")


class OddIdModel(BaseChatModel):
    """Answers with the receipt of the last human text, under an id with a lone surrogate."""

    @property
    def _llm_type(self) -> str:
        return "odd-id"

    def bind_tools(self, tools: Any, **kwargs: Any) -> OddIdModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        reply = AIMessage(receipt(_human(messages)), id=f"ai-\udc00-{uuid.uuid4().hex[:8]}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


class AskExpertModel(BaseChatModel):
    """The parent: asks the `ask_expert` tool once per turn, then answers with a receipt."""

    questions: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "ask-expert"

    def bind_tools(self, tools: Any, **kwargs: Any) -> AskExpertModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if messages[-1].type == "human":
            question = f"EXPERT-Q-{uuid.uuid4().hex[:8]}: what fits best?"
            self.questions.append(question)
            call = {
                "name": "ask_expert",
                "args": {"question": question},
                "id": f"c-{len(messages)}",
            }
            reply = AIMessage("", tool_calls=[call])
        else:
            reply = AIMessage(receipt(_human(messages)))
        return ChatResult(generations=[ChatGeneration(message=reply)])


async def _settled(live: LiveMemory, user: str, threads: list[str]) -> UserStatus:
    """The user's status once the threads' messages are indexed."""
    for thread in threads:
        await live.client.consolidate(user, thread)
    status = await live.client.settle(user, 90)
    assert status is not None
    return status


async def _stored(live: LiveMemory, user: str, threads: list[str]) -> list[str]:
    """Every fragment text of the user once the threads' messages are indexed."""
    await _settled(live, user, threads)
    return [f.content for f in await live.worker.store.all_for_user(user)]


def _counts(texts: list[str], lines: list[str]) -> dict[str, int]:
    return {line: sum(t.count(line) for t in texts) for line in lines}


def _agent(client: MemoryClient, model: BaseChatModel | None = None, tools: Any = ()) -> Any:
    memory = DurableMemoryMiddleware(client=client, clock=Clock())
    agent = create_agent(
        model or ReceiptModel(),
        list(tools),
        middleware=[memory],
        context_schema=Ctx,
        checkpointer=InMemorySaver(),
    )
    return agent, memory


async def test_a_failed_turn_on_a_shared_thread_never_reaches_another_user(
    live_memory: LiveMemory,
) -> None:
    """User A's turns fail on a thread id A shares with B. A sync invoke is stamped before its
    error, so its line stays A's and is stored with A's next turn. A bad user id fails before
    any stamp: on B's next turn that unstamped line may be A's failed line or B's own input
    (the list alone cannot tell), so it is stored for neither, never for the wrong user; the
    latest human line of B's input is B's, and A's later lines stay A's."""
    ua, ub = live_memory.new_user("shared-a"), live_memory.new_user("shared-b")
    agent, memory = _agent(live_memory.client)
    cfg = {"configurable": {"thread_id": f"shared-{uuid.uuid4().hex[:6]}"}}
    thread = cfg["configurable"]["thread_id"]
    a_ok = "SHA-1: my flat number is 12B."
    a_sync = "SHA-2: my bank PIN is 6620."
    a_bad = "SHA-3: my blood type is AB negative 71."
    b_line = "SHB-1: my bus route is 42X."
    a_next = "SHA-4: my dentist is on Elm Road 9."
    lines = [a_ok, a_sync, a_bad, b_line, a_next]

    await agent.ainvoke({"messages": [HumanMessage(a_ok)]}, cfg, context=Ctx(ua))
    with pytest.raises(SyncRunError, match="async-only"):
        await asyncio.to_thread(
            agent.invoke, {"messages": [HumanMessage(a_sync)]}, cfg, context=Ctx(ua)
        )
    with pytest.raises(ValueError, match="user id"):  # A's app passed an int for one turn
        await agent.ainvoke({"messages": [HumanMessage(a_bad)]}, cfg, context=Ctx(12345))
    await agent.ainvoke({"messages": [HumanMessage(b_line)]}, cfg, context=Ctx(ub))
    await agent.ainvoke({"messages": [HumanMessage(a_next)]}, cfg, context=Ctx(ua))
    assert await memory.flush(30) == 0

    in_a = _counts(await _stored(live_memory, ua, [thread]), lines)
    in_b = _counts(await _stored(live_memory, ub, [thread]), lines)
    assert in_b == {a_ok: 0, a_sync: 0, a_bad: 0, b_line: 1, a_next: 0}, in_b
    assert in_a == {a_ok: 1, a_sync: 1, a_bad: 0, b_line: 0, a_next: 1}, in_a


async def test_a_single_users_failed_turn_is_stored_on_the_next(live_memory: LiveMemory) -> None:
    """The first turn of a thread fails before any stamp: the user's next turn stores it."""
    user = live_memory.new_user("failed-first")
    agent, memory = _agent(live_memory.client)
    cfg = {"configurable": {"thread_id": "ff"}}
    first, second = "FF-1: my locker is 311.", "FF-2: my scooter is red 808."
    with pytest.raises(SyncRunError):
        await asyncio.to_thread(
            agent.invoke, {"messages": [HumanMessage(first)]}, cfg, context=Ctx(user)
        )
    await agent.ainvoke({"messages": [HumanMessage(second)]}, cfg, context=Ctx(user))
    assert await memory.flush(30) == 0
    texts = await _stored(live_memory, user, ["ff"])
    assert _counts(texts, [first, second, receipt(second)]) == {
        first: 1,
        second: 1,
        receipt(second): 1,
    }


async def test_lone_surrogates_in_ids_never_fail_a_turn(live_memory: LiveMemory) -> None:
    """Half an emoji in a thread id, a message id or the model reply's id: the turn goes
    through and every line is stored once; two thread ids that differ only there stay apart."""
    user = live_memory.new_user("surrogate")
    agent, memory = _agent(live_memory.client, OddIdModel())
    cases = [
        ("t-\ud83d-x", None, "SUR-1: my code is 101."),
        ("t-\ud83e-x", None, "SUR-2: my code is 202."),
        ("t-plain", "h-\udfff", "SUR-3: my code is 303."),
        ("t-plain", "🦜\ud83d-id", "SUR-4: my code is 404."),
        ("t-plain", "i" * 50_000, "SUR-5: my code is 505."),
    ]
    for thread, message_id, line in cases:
        message = HumanMessage(line, id=message_id)
        await agent.ainvoke(
            {"messages": [message]}, {"configurable": {"thread_id": thread}}, context=Ctx(user)
        )
    assert await memory.flush(30) == 0
    threads = sorted({thread_key(thread) for thread, _, _ in cases})
    assert len(threads) == 3, threads  # the two surrogate thread ids are two threads
    status = await _settled(live_memory, user, threads)
    assert sorted(status.watermarks) == threads
    texts = [f.content for f in await live_memory.worker.store.all_for_user(user)]
    lines = [line for _, _, line in cases]
    counts = _counts(texts, lines + [receipt(line) for line in lines])
    assert all(n == 1 for n in counts.values()), counts


async def test_a_message_id_reused_every_turn_stores_every_line(live_memory: LiveMemory) -> None:
    """An app sends HumanMessage(id="user-input") each turn: each line is its own message; the
    same message re-sent unchanged is still recognised (stored once)."""
    user = live_memory.new_user("reused-id")
    agent, memory = _agent(live_memory.client)
    cfg = {"configurable": {"thread_id": "rid"}}
    lines = [f"RID-{i}: my tram pass number is {9000 + i * 41}." for i in range(4)]
    for line in lines:
        await agent.ainvoke(
            {"messages": [HumanMessage(line, id="user-input")]}, cfg, context=Ctx(user)
        )
        await memory.flush(10)
    # The last line again, unchanged (an app retrying the same request).
    await agent.ainvoke(
        {"messages": [HumanMessage(lines[-1], id="user-input")]}, cfg, context=Ctx(user)
    )
    assert await memory.flush(30) == 0
    texts = await _stored(live_memory, user, ["rid"])
    counts = _counts(texts, lines)
    assert counts == dict.fromkeys(lines, 1), counts


@pytest.mark.parametrize("stamp", [0, -5.0, math.inf, "0"])
async def test_a_non_positive_or_infinite_time_stamp_is_stamped_now(
    live_memory: LiveMemory, stamp: Any
) -> None:
    """A caller's time stamp of 0, a negative or an infinite one is no time: the line is
    stamped when first seen and stored (the workflow refuses anything at its 0.0 horizon)."""
    user = live_memory.new_user("stamp")
    agent, memory = _agent(live_memory.client)
    line = f"STAMP-{stamp}: my umbrella is tagged {uuid.uuid4().hex[:6]}."
    message = HumanMessage(line, additional_kwargs={"time": stamp})
    await agent.ainvoke(
        {"messages": [message]}, {"configurable": {"thread_id": "st"}}, context=Ctx(user)
    )
    assert await memory.flush(30) == 0
    texts = await _stored(live_memory, user, ["st"])
    assert _counts(texts, [line, receipt(line)]) == {line: 1, receipt(line): 1}


async def test_a_sub_agent_inside_a_tool_keys_a_thread_of_its_own(live_memory: LiveMemory) -> None:
    """A sub-agent with the middleware, run from a tool, inherits the parent's thread id: its
    messages go to a thread of their own, never among the parent thread's."""
    user = live_memory.new_user("sub-agent")
    sub_memory = DurableMemoryMiddleware(client=live_memory.client, clock=Clock())
    sub_agent = create_agent(ReceiptModel(), [], middleware=[sub_memory], context_schema=Ctx)

    @tool
    async def ask_expert(question: str, runtime: ToolRuntime[Any, Any]) -> str:
        """Ask the expert sub-agent."""
        out = await sub_agent.ainvoke(
            {"messages": [HumanMessage(question)]}, context=runtime.context
        )
        return str(out["messages"][-1].content)

    parent = AskExpertModel()
    agent, memory = _agent(live_memory.client, parent, [ask_expert])
    cfg = {"configurable": {"thread_id": "par"}}
    lines = [f"SUB-{i}: my boiler is a Vaillant {300 + i * 7}." for i in range(3)]
    for line in lines:
        await agent.ainvoke({"messages": [HumanMessage(line)]}, cfg, context=Ctx(user))
    assert await memory.flush(30) == 0 and await sub_memory.flush(30) == 0
    nested = f"par{NESTED_SEPARATOR}tools"
    status = await _settled(live_memory, user, ["par", nested])
    assert sorted(status.watermarks) == sorted(["par", nested])
    fragments = await live_memory.worker.store.all_for_user(user)
    in_parent = [f.content for f in fragments if f.thread_id == "par"]
    assert _counts(in_parent, lines) == dict.fromkeys(lines, 1)
    # The sub-agent's human lines are not the parent's (the parent's own tool call names the
    # question among its arguments, as the assistant's words).
    assert not any(f"User: {q}" in t for q in parent.questions for t in in_parent)
    assert any(q in t for q in parent.questions for t in in_parent)  # the test can fail
    # The parent thread's positions are its own: no message of the sub-agent's among them.
    final = await agent.aget_state(cfg)
    assert status.watermarks["par"].accepted <= len(final.values["messages"])
