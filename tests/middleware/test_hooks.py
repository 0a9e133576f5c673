"""DurableMemoryMiddleware hooks called directly, with memory down (nothing listens) or only Redis.

The pure rules (stamping, conversion, trigger, trimming, prompt rewrite, user-id resolution) are
checked on hand-built states; the MemoryClient is the real one, pointed at closed ports, so "memory
down -> the turn goes on" is checked with the real failure paths.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis
from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.runtime import ExecutionInfo, Runtime
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from mnemoflow.devstack.processes import free_port
from mnemoflow.memory.prompt import FRAGMENTS_HEADING, PROFILE_HEADING
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.durable_memory import accepted_key
from mnemoflow.middleware.payloads import MAX_EVENT_BYTES, split_event, trim_turn
from mnemoflow.middleware.window import (
    OWNER_KEY,
    UNKEPT_KEY,
    handover_trigger,
    message_identity,
    message_text,
    owner_of,
    resolve_user_id,
    stamp_messages,
    to_turns,
    window_start,
)
from mnemoflow.models.config import BudgetPattern, MemoryConfig
from mnemoflow.models.contracts import ContextFragment, InjectedContext, Watermark
from mnemoflow.models.errors import MemoryUnavailableError
from mnemoflow.models.ids import context_key
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn

T0 = 1_700_000_000.0
SMALL = MemoryConfig(pattern=BudgetPattern.MESSAGES, trigger_threshold=6, max_input_tokens=256)


@dataclass
class Ctx:
    user_id: str


class PydCtx(BaseModel):
    user_id: str


def runtime(user: Any = None, thread: str = "t1") -> Runtime[Any]:
    info = ExecutionInfo(checkpoint_id="c", checkpoint_ns="", task_id="k", thread_id=thread)
    return Runtime(context=Ctx(user) if isinstance(user, str) else user, execution_info=info)


def chat(n: int) -> list[Any]:
    """n alternating human/ai messages with ids, stamped 35 s apart from T0."""
    out: list[Any] = []
    for i in range(n):
        cls = HumanMessage if i % 2 == 0 else AIMessage
        out.append(cls(content=f"message {i}", id=f"m{i}", additional_kwargs={"time": T0 + 35 * i}))
    return out


@pytest.fixture
async def down_client() -> AsyncIterator[MemoryClient]:
    """A real MemoryClient whose Temporal and Redis ports have nothing listening."""
    temporal = await Client.connect(
        f"127.0.0.1:{free_port()}", lazy=True, data_converter=pydantic_data_converter
    )
    client = MemoryClient(
        temporal=temporal,
        task_queue="nobody",
        redis=f"redis://127.0.0.1:{free_port()}/0",
        config=SMALL,
        query_timeout_s=0.5,
        close_timeout_s=0.5,
    )
    try:
        yield client
    finally:
        await client.aclose()


# --- pure rules -------------------------------------------------------------------------------


def test_stamping_keeps_existing_stamps_and_ids() -> None:
    msgs = [HumanMessage("a", id="1", additional_kwargs={"time": 5.0}), AIMessage("b", id="2")]
    stamped = stamp_messages(msgs, now=99.0)
    assert [(m.id, m.additional_kwargs["time"]) for m in stamped] == [("2", 99.0)]
    assert msgs[1].additional_kwargs == {}, "the original message must not be mutated"
    assert stamp_messages(stamped, now=123.0) == []


def test_a_read_only_stamp_marks_only_messages_new_to_memory() -> None:
    owner = owner_of("ada")
    seen = stamp_messages([HumanMessage("kept", id="k")], now=10.0, owner=owner)[0]
    msgs = [seen, AIMessage("reply", id="r"), HumanMessage("off the record", id="o")]
    stamped = {m.id: m for m in stamp_messages(msgs, now=20.0, owner=owner, keep=False)}
    assert set(stamped) == {"r", "o"}, "a message memory had seen keeps its stamps"
    assert all(m.additional_kwargs[UNKEPT_KEY] is True for m in stamped.values())
    turns = to_turns([seen, *stamped.values()], "th", now=30.0, user_id="ada")
    assert [t.content for t in turns] == ["kept"], "read-only lines never become turns"


def test_conversion_to_chat_turns() -> None:
    msgs = [
        SystemMessage("be kind", id="s"),
        HumanMessage(
            content=[
                {"type": "text", "text": "look at this"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
            ],
            id="h",
            additional_kwargs={"time": T0},
        ),
        AIMessage("", id="a", tool_calls=[{"name": "lookup", "args": {}, "id": "c1"}]),
        ToolMessage("", tool_call_id="c1", id="t", name="lookup"),
    ]
    turns = to_turns(msgs, "th", now=T0 + 9)[1:]
    assert [(t.position, t.role) for t in turns] == [(1, "human"), (2, "ai"), (3, "tool")]
    assert [t.message_id for t in turns] == ["h", "a", "t"]
    assert turns[0].content == "look at this\n[image_url]" and turns[0].time == T0
    assert turns[1].content == "[tool call: lookup]" and turns[1].time == T0 + 9
    assert turns[2].content == "" and turns[2].name == "lookup"
    assert message_text(msgs[0]) == "be kind"


def test_identity_survives_rewrites_and_owners_and_summaries_are_respected() -> None:
    ada, bob = owner_of("ada"), owner_of("bob")
    msgs = [
        HumanMessage(
            "summary of the talk so far", id="s1", additional_kwargs={"lc_source": "summarization"}
        ),
        HumanMessage("Ada's line", id="a1", additional_kwargs={"time": T0, OWNER_KEY: ada}),
        HumanMessage("Bob's line", id="b1", additional_kwargs={"time": T0 + 1, OWNER_KEY: bob}),
        AIMessage("an old reply without an owner", id="o1", additional_kwargs={"time": T0 + 2}),
    ]
    kept = to_turns(msgs, "th", now=T0 + 9, user_id="ada")
    # No summary, none of Bob's: the unstamped reply follows Bob's question, so it was added in
    # Bob's turn; it was stored for every user of the thread before.
    assert [t.message_id for t in kept] == ["a1"]
    assert [t.message_id for t in to_turns(msgs, "th", now=T0, user_id="bob")] == ["b1", "o1"]
    # An id is the identity wherever the message sits; without one, tool call id or content.
    moved = [msgs[3], msgs[1]]
    assert [message_identity(m) for m in moved] == ["o1", "a1"]
    tool = ToolMessage("42", tool_call_id="call-7")
    assert message_identity(tool) == "tool:call-7"
    bare = AIMessage("no id", additional_kwargs={"time": T0})
    assert (
        message_identity(bare)
        == message_identity(bare.model_copy())
        != message_identity(AIMessage("no id", additional_kwargs={"time": T0 + 1}))
    )


def test_trigger_is_local_budget_then_ceiling() -> None:
    assert handover_trigger(chat(2), SMALL) == (False, "handover")
    assert handover_trigger(chat(6), SMALL) == (False, "budget")
    huge = [HumanMessage("x" * 3000, id="h")]
    assert handover_trigger(huge, SMALL) == (True, "ceiling")


def test_trimming_only_over_budget_below_indexed_and_never_past_the_last_human() -> None:
    assert window_start(chat(4), indexed=4, config=SMALL) == 0, "under budget: no trim"
    msgs = chat(10)
    assert window_start(msgs, indexed=6, config=SMALL) == 6
    assert window_start(msgs, indexed=10, config=SMALL) == 8, "the last human (8) stays"
    assert window_start(msgs, indexed=0, config=SMALL) == 0
    msgs[5] = ToolMessage("result", tool_call_id="c", id="m5")
    assert window_start(msgs, indexed=5, config=SMALL) == 4, "keep the call of a tool result"


def test_huge_turns_are_trimmed_and_split_below_the_payload_limit() -> None:
    big = ChatTurn(thread_id="t", position=0, role="tool", content="x" * 5_000_000, time=T0)
    assert len(trim_turn(big, 8000).content) <= 8000
    wide = trim_turn(big, 10_000_000)  # a config asking for more still cannot pass the limit
    assert len(wide.model_dump_json()) < MAX_EVENT_BYTES
    emoji = big.model_copy(update={"content": "😀\x01" * 400_000})
    assert len(trim_turn(emoji, 10_000_000).model_dump_json().encode()) < MAX_EVENT_BYTES
    turns = [trim_turn(big.model_copy(update={"position": i}), 200_000) for i in range(12)]
    chunks = list(split_event(turns))
    assert len(chunks) > 1 and sum(len(c) for c in chunks) == 12
    assert all(sum(len(t.model_dump_json()) for t in c) <= MAX_EVENT_BYTES for c in chunks)


def test_user_id_resolution() -> None:
    assert resolve_user_id({}, Ctx("a")) == "a"
    assert resolve_user_id({}, {"user_id": "b"}) == "b"
    assert resolve_user_id({}, PydCtx(user_id="c")) == "c"
    assert resolve_user_id({"user_id": "d"}, None) == "d"
    with pytest.raises(ValueError, match="DurableMemoryMiddleware needs a user id"):
        resolve_user_id({"messages": []}, None)
    with pytest.raises(ValueError, match="usable user id"):
        resolve_user_id({}, Ctx("  "))


# --- hooks with memory down -------------------------------------------------------------------


async def test_remember_must_be_a_bool(down_client: MemoryClient) -> None:
    with pytest.raises(TypeError, match="remember must be True or False"):
        DurableMemoryMiddleware(client=down_client, remember="no")  # type: ignore[arg-type]


async def test_missing_user_id_fails_the_turn_clearly(down_client: MemoryClient) -> None:
    mw = DurableMemoryMiddleware(client=down_client)
    with pytest.raises(ValueError, match="needs a user id"):
        await mw.abefore_agent({"messages": chat(1)}, runtime(None))


async def test_before_agent_stamps_only_unstamped_messages(down_client: MemoryClient) -> None:
    mw = DurableMemoryMiddleware(client=down_client, clock=lambda: T0 + 1000)
    msgs = [*chat(2), HumanMessage("new", id="n")]
    update = await mw.abefore_agent({"messages": msgs}, runtime("u"))
    assert update is not None
    times = [(m.id, m.additional_kwargs["time"]) for m in update["messages"]]
    assert times == [("m0", T0), ("m1", T0 + 35), ("n", T0 + 1000)]  # old stamps kept
    assert {m.additional_kwargs[OWNER_KEY] for m in update["messages"]} == {owner_of("u")}
    assert "memory_accepted" not in update
    assert down_client.outbox.pending("u") == 3  # held for the end of the turn


async def test_memory_down_the_turn_goes_on_untrimmed(down_client: MemoryClient) -> None:
    mw = DurableMemoryMiddleware(client=down_client, core_prompt="CORE")
    msgs = chat(9)
    seen: list[ModelRequest[Any]] = []

    async def handler(req: ModelRequest[Any]) -> ModelResponse[Any]:
        seen.append(req)
        return ModelResponse(result=[AIMessage("ok")])

    request = ModelRequest(
        model=None,  # type: ignore[arg-type]
        messages=msgs,
        system_message=SystemMessage("ignored"),
        tool_choice=None,
        tools=[],
        response_format=None,
        state={"messages": msgs},
        runtime=runtime("u"),
    )
    started = time.monotonic()
    await mw.awrap_model_call(request, handler)
    assert time.monotonic() - started < 2.0
    assert seen[0].messages == msgs and seen[0].system_message is not None
    assert seen[0].system_message.content == "CORE"

    update = await mw.aafter_agent({"messages": msgs}, runtime("u"))
    # The hand-over fails in the background, the turn did not; the outbox keeps every message
    # (and the reply the model call gave) and retries.
    assert await mw.flush(timeout_s=0.3) == 10
    assert update is None or "memory_accepted" not in update
    again = await mw.abefore_agent({"messages": msgs}, runtime("u"))
    assert again is None or "memory_accepted" not in again
    assert (
        down_client.outbox.pending("u") == 10
        and down_client.outbox.metrics.retries._value.get() >= 1
    )


async def test_client_fails_fast_and_clearly(down_client: MemoryClient) -> None:
    assert await down_client.context("u") is None
    turn = ChatTurn(thread_id="t", position=0, role="human", content="hi", time=T0)
    with pytest.raises(MemoryUnavailableError):
        await down_client.submit("u", [turn])
    with pytest.raises(ValueError):
        await down_client.submit("", [turn])
    with pytest.raises(ValueError, match="query_timeout_s"):
        MemoryClient(temporal=down_client.temporal, task_queue="q", query_timeout_s=5)
    plain = await Client.connect("127.0.0.1:1", lazy=True)
    with pytest.raises(ValueError, match="pydantic"):
        MemoryClient(temporal=plain, task_queue="q")


# --- trimming and injection from a real read model (Redis up, Temporal down) ------------------


async def test_prompt_rewrite_trim_and_fragment_filter(redis_url: str, unique_name: str) -> None:
    prefix = f"{unique_name}:"
    temporal = await Client.connect(
        f"127.0.0.1:{free_port()}", lazy=True, data_converter=pydantic_data_converter
    )
    client = MemoryClient(
        temporal=temporal,
        task_queue="q",
        redis=redis_url,
        key_prefix=prefix,
        config=SMALL,
        close_timeout_s=0.1,
    )
    frag = lambda i, thread, newest: ContextFragment(  # noqa: E731
        id=f"f{i}",
        theme=f"theme {i}",
        types=["fact"],
        content=f"fact {i}",
        thread_id=thread,
        created_at=0.0 if newest is None else T0 + 35 * newest,
    )
    context = InjectedContext(
        user_id="u",
        version=3,
        profile=UserProfile(name="Ada"),
        fragments=[
            frag(1, "t1", 3),
            frag(2, "t1", 7),
            frag(3, "other", 1),
            frag(4, "", None),
        ],
        # Messages 0-5 are indexed: 6 still waits for its round.
        watermarks={"t1": Watermark(accepted=10, indexed=6, pending_since=T0 + 35 * 6)},
        top_k=2,
    )
    raw = aioredis.Redis.from_url(redis_url)
    await raw.set(context_key(prefix, "u"), context.model_dump_json())
    mw = DurableMemoryMiddleware(client=client)
    msgs = chat(10)
    seen: list[ModelRequest[Any]] = []

    async def handler(req: ModelRequest[Any]) -> ModelResponse[Any]:
        seen.append(req)
        return ModelResponse(result=[AIMessage("ok")])

    request = ModelRequest(
        model=None,  # type: ignore[arg-type]
        messages=msgs,
        system_message=SystemMessage("You are the shop assistant."),
        tool_choice=None,
        tools=[],
        response_format=None,
        state={
            "messages": msgs,
            "memory_accepted": {accepted_key("u", "t1"): {"upto": "m9", "more": []}},
        },
        runtime=runtime("u"),
    )
    try:
        await mw.awrap_model_call(request, handler)
        await mw.flush(timeout_s=0.1)  # the reinforce signal fails in the background
    finally:
        await raw.aclose()
        await client.aclose()
    sent = seen[0]
    assert [m.id for m in sent.messages] == [f"m{i}" for i in range(6, 10)]
    prompt = str(sent.system_message.content if sent.system_message else "")
    assert prompt.startswith("You are the shop assistant.")
    assert prompt.index(PROFILE_HEADING) < prompt.index(FRAGMENTS_HEADING)
    # f2's newest message (7) is still in the window from 6: skipped; then top_k=2 of the rest.
    assert "fact 1" in prompt and "fact 3" in prompt
    assert "fact 2" not in prompt and "fact 4" not in prompt
    assert len(request.messages) == 10, "the request (and state) keep every message"
