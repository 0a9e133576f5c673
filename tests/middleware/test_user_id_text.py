"""A user id that is not valid Unicode text (a lone surrogate, as a bad bytes-to-str decode
leaves it) is refused with InvalidInputError at validation, so at the turn it is the same clear
error as any other unusable user id (README: "without one the first turn raises a clear
ValueError"), never a UnicodeEncodeError from deep inside a hash; on the dev server with the
real worker, Redis and Milvus Lite."""

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

from mnemoflow.middleware import DurableMemoryMiddleware
from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.ids import validate_user_id
from tests.middleware.conftest import LiveMemory

pytestmark = pytest.mark.integration

LONE_SURROGATES = ["a\ud800", "\udc00b", "x\udfff\ud800y"]


@dataclass
class Ctx:
    user_id: Any


class Echo(BaseChatModel):
    """Answers "ok" to every call."""

    @property
    def _llm_type(self) -> str:
        return "echo"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("ok"))])


@pytest.mark.parametrize("user_id", LONE_SURROGATES)
def test_a_lone_surrogate_is_refused_at_validation(user_id: str) -> None:
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        validate_user_id(user_id)


def test_text_of_any_script_is_still_a_user_id() -> None:
    for user_id in ["用户-Ünïcødé-🦜", "\U0001f600", "ada"]:
        assert validate_user_id(user_id) == user_id


async def test_a_lone_surrogate_user_id_is_a_clear_error_at_the_turn(
    live_memory: LiveMemory,
) -> None:
    client = live_memory.client
    agent = create_agent(
        Echo(), [], middleware=[DurableMemoryMiddleware(client=client)],
        checkpointer=InMemorySaver(),
    )  # fmt: skip
    config: Any = {"configurable": {"thread_id": "t"}}
    for bad in LONE_SURROGATES:
        # The middleware's error for any unusable id (a ValueError naming it), raised before
        # anything is handed over.
        with pytest.raises(ValueError, match=r"usable user id.*lone surrogate"):
            await agent.ainvoke({"messages": [HumanMessage("hi")]}, config, context=Ctx(bad))
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            await client.submit(bad, [])
        assert await client.context(bad) is None  # the hot path's read never raises
    query = f"TaskQueue = '{live_memory.worker.task_queue}'"
    listed = [w async for w in live_memory.worker.client.list_workflows(query)]
    assert listed == [], "a workflow was started for an unusable user id"
    # The agent and the memory serve the next turn of a usable user as before.
    user = live_memory.new_user("text")
    started = time.monotonic()
    out = await agent.ainvoke({"messages": [HumanMessage("hi")]}, config, context=Ctx(user))
    assert out["messages"][-1].content == "ok" and time.monotonic() - started < 30
