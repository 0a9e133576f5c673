"""A delete through MnemoflowStore holds like forget_fragment: once it returned, neither get, nor
search, nor a new thread's injected context, nor Milvus has the item, also after a round that
was started around the delete (its selection may have read the item first) and after one more
round. Dev server, real worker, Milvus Lite and Redis; the agent is `create_agent` with the
DurableMemoryMiddleware, and a chat model that records every system prompt it was sent."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from mnemoflow import DurableMemoryMiddleware, MnemoflowStore
from mnemoflow.memory.prompt import FRAGMENTS_HEADING
from mnemoflow.models.turns import ChatTurn
from tests.middleware.conftest import LiveMemory

pytestmark = pytest.mark.integration

SECRET = "4471-QX"


@dataclass
class Ctx:
    user_id: str


class PromptRecorder(BaseChatModel):
    """Says "noted" and keeps the system prompt of every call."""

    prompts: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "prompt-recorder"

    def bind_tools(self, tools: Any, **kwargs: Any) -> PromptRecorder:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        first = messages[0]
        self.prompts.append(str(first.content) if first.type == "system" else "")
        return ChatResult(generations=[ChatGeneration(message=AIMessage("noted"))])


def talk(thread: str, lines: list[str], t0: float) -> list[ChatTurn]:
    """Turns said hours ago (mature at once), distinct per thread."""
    return [
        ChatTurn(
            thread_id=thread,
            position=i,
            role="human" if i % 2 == 0 else "ai",
            content=text,
            time=t0 + 30 * i,
            message_id=f"{thread}-{i}",
        )
        for i, text in enumerate(lines)
    ]


async def test_delete_leaves_nothing_to_resurrect(live_memory: LiveMemory) -> None:
    client = live_memory.client
    store = MnemoflowStore(client)
    user = live_memory.new_user("store-forget")
    ns = ("memories", user)
    model = PromptRecorder()
    mw = DurableMemoryMiddleware(client=client, core_prompt="You are a concierge.")
    agent = create_agent(
        model, [], middleware=[mw], context_schema=Ctx, checkpointer=InMemorySaver()
    )

    async def new_thread_prompt(thread: str, question: str) -> str:
        await agent.ainvoke(
            {"messages": [HumanMessage(question)]},
            {"configurable": {"thread_id": thread}},
            context=Ctx(user),
        )
        return model.prompts[-1]

    await store.aput(ns, "locker", {"text": f"Ada's locker code is {SECRET}"})
    await store.aput(ns, "hobby", {"text": "Ada rides a gravel bike on Sundays"})
    # The item is injected into a new thread before the delete: the checks below can fail.
    assert SECRET in await new_thread_prompt("before", "What is my locker code?")

    # A round starts right before the delete: its selection reads the user's fragments.
    t0 = time.time() - 3 * 3600
    chat = ["I repainted my bike frame blue.", "Blue suits a gravel bike.", "Thanks!", "Ok."]
    await client.submit(user, talk("round-1", chat, t0), urgent=True)
    await store.adelete(ns, "locker")

    async def nothing_left(where: str) -> None:
        assert await store.aget(ns, "locker") is None, where
        assert [r.key for r in await store.asearch(ns)] == ["hobby"], where
        assert all(
            SECRET not in str(r.value) for r in await store.asearch(ns, query="locker code")
        ), where
        context = await client.context(user)
        assert context is not None and all(SECRET not in f.content for f in context.fragments)
        found = await client.search(user, "What is my locker code?", time.time()) or []
        assert all(SECRET not in f.content for f in found), where
        rows = await live_memory.worker.store.all_for_user(user)
        assert rows and all(SECRET not in r.content for r in rows), where

    await nothing_left("right after the delete")
    await mw.flush()  # the agent's own turns go to rounds too: none may bring the item back
    await client.consolidate(user, "before")
    await client.settle(user, 90)
    await nothing_left("after the round started around the delete")
    prompt = await new_thread_prompt("after-1", "What is my locker code? Which bike do I ride?")
    assert SECRET not in prompt and FRAGMENTS_HEADING in prompt  # memory is injected

    more = ["My locker is near the pool.", "Noted.", "The pool opens at 7.", "Ok."]
    await client.submit(user, talk("round-2", more, t0 + 600), urgent=True)
    await mw.flush()
    await client.consolidate(user, "after-1")
    status = await client.settle(user, 90)
    assert status is not None and status.rounds_completed >= 2
    await nothing_left("after the next round")
    prompt = await new_thread_prompt("after-2", "Tell me my locker code and my bike")
    assert SECRET not in prompt and FRAGMENTS_HEADING in prompt  # memory is injected
