"""A long message is stored whole, or cut with a clear error, never cut silently
(docs/ARCHITECTURE.md, "Invariants": nothing said is lost; middleware/long_turns.py).

A human message over `max_turn_chars` (8,000) used to be cut to its first 8,000 characters with
only a "[…trimmed N chars]" mark: of a 120,000-character message of 3,000 distinct sentences,
210 reached memory. It is now handed over in parts that join to its text.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from mnemoflow.middleware import DurableMemoryMiddleware
from mnemoflow.middleware.long_turns import part_id, split_turn
from mnemoflow.middleware.payloads import MAX_TURN_BYTES, TRIM_MARK
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.turns import ChatTurn, turn_identity
from tests.middleware.conftest import LiveMemory
from tests.middleware.test_delivery import HOUR, Ctx, settled
from tests.support.chat import ReceiptModel, receipt

T0 = 1_700_000_000.0


def sentences(n: int, tag: str = "Fact") -> list[str]:
    return [f"{tag} {i:05d}: shelf {i * 7 + 1} holds box {i * 13 + 2}." for i in range(n)]


def human(text: str, message_id: str = "m1#owner") -> ChatTurn:
    return ChatTurn(
        thread_id="t", position=3, role="human", content=text, time=T0, message_id=message_id
    )


def test_a_long_message_becomes_parts_that_join_to_its_text() -> None:
    said = sentences(3000)
    text = " ".join(said)
    parts, cut = split_turn(human(text), 8000, 200_000)
    assert cut == 0 and len(text) > 100_000
    assert "".join(p.content for p in parts) == text
    assert all(len(p.content) <= 8000 for p in parts) and len(parts) >= len(text) // 8000
    assert [p.message_id for p in parts] == [part_id("m1#owner", k) for k in range(len(parts))]
    assert parts[0].message_id == "m1#owner", "the first part keeps the message's identity"
    assert len({turn_identity(p) for p in parts}) == len(parts)
    assert {(p.time, p.role, p.position) for p in parts} == {(T0, "human", 3)}
    whole = sum(1 for s in said if sum(p.content.count(s) for p in parts) == 1)
    assert whole == len(said), "every sentence in exactly one part (cut at sentence ends)"
    assert split_turn(human(text), 8000, 200_000) == (parts, 0), "the same parts on a re-send"


def test_parts_of_any_script_stay_within_the_turn_bound_and_ids_within_their_limit() -> None:
    for unit in ("😀\x01", "数据记忆", "word "):
        text = unit * 150_000
        parts, cut = split_turn(human(text, "x" * 256), 400_000, 1_000_000)
        assert cut == 0 and "".join(p.content for p in parts) == text
        assert all(len(p.model_dump_json().encode()) <= MAX_TURN_BYTES for p in parts)
        assert all(len(p.message_id) <= 256 for p in parts)
        assert len({p.message_id for p in parts}) == len(parts)
    unsplit = "no sentence end and no space ".replace(" ", "") * 1000
    parts, _ = split_turn(human(unsplit), 8000, 200_000)
    assert (
        "".join(p.content for p in parts) == unsplit and max(len(p.content) for p in parts) == 8000
    )


def test_past_the_message_bound_the_rest_is_cut_and_said_so() -> None:
    text = " ".join(sentences(1000))  # 40,000 characters
    parts, cut = split_turn(human(text), 8000, 20_000)
    assert cut == len(text) - 20_000
    assert parts[-1].content.endswith(TRIM_MARK.format(n=cut))
    assert all(len(p.content) <= 8000 for p in parts), "the mark fits: the workflow cuts nothing"
    assert "".join(p.content for p in parts) == text[:20_000] + TRIM_MARK.format(n=cut)
    tool = ChatTurn(thread_id="t", position=0, role="tool", content="y" * 50_000, time=T0)
    (trimmed,), cut = split_turn(tool, 8000, 200_000)
    assert len(trimmed.content) <= 8000 and cut == 0, "tool output is not memory: one turn"
    assert split_turn(human("short"), 8000, 200_000) == ([human("short")], 0)


def test_the_bound_is_a_config_field() -> None:
    assert MemoryConfig().max_message_chars == 200_000
    with pytest.raises(ValueError):
        MemoryConfig(max_message_chars=2_000_000)


@pytest.mark.integration
async def test_a_120k_character_message_is_stored_sentence_by_sentence(
    live_memory: LiveMemory,
) -> None:
    client, mw = live_memory.client, live_memory.worker
    user = live_memory.new_user("long")
    clock = {"t": T0 - 3 * HOUR}

    def tick() -> float:
        clock["t"] += 7.0
        return clock["t"]

    memory = DurableMemoryMiddleware(client=client, clock=tick)
    agent = create_agent(
        ReceiptModel(), [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "long"}}
    said = sentences(3000)
    big = " ".join(said)
    short = "LONG-after: my locker is 4471."
    await agent.ainvoke({"messages": [HumanMessage(big)]}, config, context=Ctx(user))
    await agent.ainvoke({"messages": [HumanMessage(short)]}, config, context=Ctx(user))
    assert await memory.flush(60) == 0
    status = await settled(client, user, ["long"])
    stored = [f.content for f in await mw.store.all_for_user(user)]
    counts = [sum(t.count(s) for t in stored) for s in said]
    lost, twice = counts.count(0), sum(n - 1 for n in counts if n > 1)
    assert (lost, twice) == (0, 0), f"of {len(said)} sentences {lost} lost, {twice} duplicated"
    others = [short, receipt(big), receipt(short)]
    assert [sum(t.count(o) for t in stored) for o in others] == [1, 1, 1]
    assert client.outbox.metrics.cut_messages._value.get() == 0
    # A resync from the checkpointer (a process that died) adds nothing: parts are idempotent.
    accepted = status.watermarks["long"].accepted
    state = await agent.aget_state(config)
    await client.resync(user, "long", state.values["messages"])
    after = await client.status(user)
    assert after is not None and after.watermarks["long"].accepted == accepted


@pytest.mark.integration
async def test_a_message_past_the_bound_is_cut_with_an_error_and_a_count(
    live_memory: LiveMemory, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    mw = live_memory.worker
    async with mw.memory_client(redis_url, config=MemoryConfig(max_message_chars=20_000)) as client:
        user = f"cut-{uuid.uuid4().hex[:8]}"
        mw.track(client.workflow_id(user))
        memory = DurableMemoryMiddleware(client=client, clock=lambda: T0 - HOUR)
        agent = create_agent(
            ReceiptModel(), [], middleware=[memory], context_schema=Ctx,
            checkpointer=InMemorySaver(),
        )  # fmt: skip
        said = sentences(1000, "Cut")  # 1,000 sentences, 39,000 characters
        text = " ".join(said)
        with caplog.at_level(logging.ERROR, logger="mnemoflow.middleware.client"):
            await agent.ainvoke(
                {"messages": [HumanMessage(text)]},
                {"configurable": {"thread_id": "cut"}},
                context=Ctx(user),
            )
            assert await memory.flush(30) == 0
        await settled(client, user, ["cut"])
        stored = [f.content for f in await mw.store.all_for_user(user)]
        within = [s for s in said if text.index(s) + len(s) <= 20_000]
        kept = [s for s in said if any(s in t for t in stored)]
        assert kept == within and 400 < len(kept) < 1000
        assert client.outbox.metrics.cut_messages._value.get() == 1
        assert client.outbox.metrics.cut_chars._value.get() == len(text) - 20_000
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert any("handed over cut" in e and str(len(text) - 20_000) in e for e in errors)


@pytest.mark.integration
async def test_long_emoji_and_cjk_messages_are_stored_whole(live_memory: LiveMemory) -> None:
    """A round's drafts are bounded in number, so three long messages of 4-byte (emoji) or
    3-byte (CJK) characters made fragments over Milvus's 65,535-byte VARCHAR, which the store
    clipped: 2,090 of 8,100 sentences were lost. Fragments are now cut to fit, never clipped."""
    client, mw = live_memory.client, live_memory.worker
    user = live_memory.new_user("wide")
    memory = DurableMemoryMiddleware(client=client, clock=lambda: T0 - 3 * HOUR)
    agent = create_agent(
        ReceiptModel(), [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "wide"}}
    said: list[str] = []
    for k, unit in enumerate(["\U0001f600" * 60, "记忆数据" * 20, "\U0001f389" * 60]):
        sentences = [f"W{k}S{j:04d} {unit}." for j in range(2600)]
        text = " ".join(sentences)[:190_000]
        said += [s for s in sentences if s in text]
        await agent.ainvoke({"messages": [HumanMessage(text)]}, config, context=Ctx(user))
    assert await memory.flush(60) == 0
    await settled(client, user, ["wide"])
    stored = [f.content for f in await mw.store.all_for_user(user)]
    assert max(len(text.encode()) for text in stored) < 65_535
    counts = [sum(text.count(s) for text in stored) for s in said]
    lost, twice = counts.count(0), sum(n - 1 for n in counts if n > 1)
    assert (lost, twice) == (0, 0), f"of {len(said)} sentences {lost} lost, {twice} duplicated"
