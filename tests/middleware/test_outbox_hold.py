"""A turn's messages wait for the turn, whatever an earlier turn of the thread still has queued
(docs/ARCHITECTURE.md, "Delivery"): held while the turn runs, delivered in the version the turn
ends with, one signal per turn; the earlier turn's messages are still delivered, once.

Other middleware may edit a message in place after memory captured it (a before_model that
redacts a PIN): when the previous turn's delivery was still queued (in flight, or waiting for its
retry), the new turn's messages joined it unheld and were sent from before_agent, so the PIN
reached memory in 1-3 of 4 back-to-back turns.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import after_model, before_model
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver

from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.outbox import Outbox
from mnemoflow.middleware.window import message_identity
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import LLMUsage
from tests.middleware.conftest import LiveMemory
from tests.middleware.test_delivery import HOUR, Ctx, settled
from tests.middleware.test_outbox import Recorder, turn
from tests.support.chat import ReceiptModel, receipt
from tests.support.drive import eventually


async def test_a_held_turn_waits_even_while_an_earlier_delivery_is_queued() -> None:
    send = Recorder()
    send.down = True
    box = Outbox(send, base_backoff_s=0.01, max_backoff_s=0.02)
    box.add("u", [turn(0), turn(1)], hold=True)
    box.release("u", "t", urgent=True, trigger="ceiling", chat_usage=LLMUsage(calls=1))

    async def failed_once() -> bool:
        return send.failures >= 1

    await eventually(failed_once, deadline_s=5, what="the first delivery to fail")
    # The next turn starts while the earlier delivery waits for its retry.
    box.add("u", [turn(2), turn(3)], hold=True)
    send.down = False

    async def earlier_delivered() -> bool:
        return box.accepted("u", "t", ["m0", "m1"]) == {"m0", "m1"}

    await eventually(earlier_delivered, deadline_s=5, what="the earlier turn's retry")
    assert send.delivered() == ["m0", "m1"], "the running turn's messages were sent unreleased"
    assert box.pending("u") == 2
    # The turn edits its message in place, then ends: the edited version is the one delivered.
    box.add("u", [turn(2).model_copy(update={"content": "line two, redacted"})], hold=True)
    box.release("u", "t", chat_usage=LLMUsage(calls=1))
    assert await box.flush(5) == 0
    assert [ids for _, ids, _ in send.calls] == [["m0", "m1"], ["m2", "m3"]], "one signal a turn"
    assert [u for _, _, u in send.calls] == [LLMUsage(calls=1), LLMUsage(calls=1)]


async def test_a_turn_added_while_an_earlier_delivery_is_in_flight_waits_for_its_release() -> None:
    gate = asyncio.Event()
    sent: list[tuple[list[str], list[str], bool]] = []

    async def slow(
        uid: str, turns: list[ChatTurn], urgent: bool, trigger: str, usage: LLMUsage | None
    ) -> None:
        await gate.wait()
        sent.append(([t.message_id or "" for t in turns], [t.content for t in turns], urgent))

    box = Outbox(slow)
    box.add("u", [turn(0)], hold=True)
    box.release("u", "t", urgent=True, trigger="ceiling")
    await asyncio.sleep(0)  # the delivery task takes the first turn and waits in its send
    box.add("u", [turn(1)], hold=True)
    gate.set()

    async def first_delivered() -> bool:
        return box.accepted("u", "t", ["m0"]) == {"m0"}

    await eventually(first_delivered, deadline_s=5, what="the first turn's delivery")
    assert [ids for ids, _, _ in sent] == [["m0"]] and box.pending("u") == 1
    box.add("u", [turn(1).model_copy(update={"content": "edited"})], hold=True)
    box.release("u", "t")
    assert await box.flush(5) == 0
    assert sent == [(["m0"], ["line 0"], True), (["m1"], ["edited"], False)]


def stamped(message_id: str, text: str, position: int = 0) -> ChatTurn:
    """A turn as the middleware hands it over: identity = its id plus a digest of its text."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return ChatTurn(
        thread_id="t", position=position, role="human", content=text, time=1.0 + position,
        message_id=f"{message_id}#{digest}",
    )  # fmt: skip


async def test_a_held_message_replaced_by_a_new_object_of_its_id_is_not_delivered() -> None:
    send = Recorder()
    box = Outbox(send, base_backoff_s=0.01, max_backoff_s=0.02)
    original = stamped("m1", "my pin is 4417")
    other = stamped("m2", "and my locker is 9")
    box.add("u", [original, other], hold=True)
    # another middleware returned a new message with the same id (the graph keeps one per id)
    redacted = stamped("m1", "my pin is ####")
    box.add("u", [redacted], hold=True)
    assert box.pending("u") == 2
    box.release("u", "t")
    assert await box.flush(5) == 0
    assert sorted(send.delivered()) == sorted([other.message_id, redacted.message_id])

    # a version already released (it may be on its way) is not taken back by a later one
    first = stamped("m3", "first version 1", 3)
    box.add("u", [first])
    assert await box.flush(5) == 0
    second = stamped("m3", "second version 2", 3)
    box.add("u", [second], hold=True)
    box.release("u", "t")
    assert await box.flush(5) == 0
    assert send.delivered()[-2:] == [first.message_id, second.message_id]


# --- the same through an agent, against the real workflow ------------------------------------


@before_model
def redact_digits(state: Any, runtime: Any) -> dict[str, Any] | None:
    """A redacting middleware: the latest human message's digits become '#', in place (same id).
    Before it edits, it waits until the previous turn's messages were delivered, so the
    earlier delivery happens while this turn runs (what back-to-back turns do by chance)."""
    for message in reversed(state["messages"]):
        if message.type == "human":
            text = str(message.content)
            if not any(c.isdigit() for c in text):
                return None
            redacted = "".join("#" if c.isdigit() else c for c in text)
            return {"messages": [message.model_copy(update={"content": redacted})]}
    return None


class FirstSendFails(MemoryClient):
    """The production client whose first delivery of any new message fails (a Temporal blip),
    so a turn's hand-over is still queued for its retry when the next turn starts."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tried: set[str] = set()

    async def _deliver(self, uid: str, turns: list[ChatTurn], *args: Any) -> None:
        new = {t.message_id or "" for t in turns} - self.tried
        self.tried |= new
        if new:
            raise ConnectionError("temporal unavailable (injected once per message)")
        await super()._deliver(uid, turns, *args)


@pytest.mark.integration
async def test_a_redacted_pin_never_reaches_memory_in_back_to_back_turns(
    live_memory: LiveMemory, redis_url: str
) -> None:
    mw = live_memory.worker
    async with FirstSendFails(
        temporal=mw.client, task_queue=mw.task_queue, redis=redis_url,
        key_prefix=mw.read_model.prefix,
    ) as client:  # fmt: skip
        user = f"hold-{uuid.uuid4().hex[:8]}"
        mw.track(client.workflow_id(user))
        clock = {"t": 1_700_000_000.0 - 3 * HOUR}

        def tick() -> float:
            clock["t"] += 7.0
            return clock["t"]

        memory = DurableMemoryMiddleware(client=client, clock=tick)
        previous: list[str] = []

        @before_model
        async def after_previous_delivered(state: Any, runtime: Any) -> None:
            async def delivered() -> bool:
                return client.accepted(user, "hold", previous) == set(previous)

            await eventually(delivered, deadline_s=20, what="the previous turn's retry")

        agent = create_agent(
            ReceiptModel(), [], middleware=[memory, after_previous_delivered, redact_digits],
            context_schema=Ctx, checkpointer=InMemorySaver(),
        )  # fmt: skip
        config = {"configurable": {"thread_id": "hold"}}
        pins = [f"{4000 + 137 * i}" for i in range(4)]
        said = [f"HOLD-{chr(65 + i)} my vault pin is {pin} today." for i, pin in enumerate(pins)]
        for text in said:
            result = await agent.ainvoke(
                {"messages": [HumanMessage(text)]}, config, context=Ctx(user)
            )
            previous = [message_identity(m) for m in result["messages"]]
        assert await memory.flush(30) == 0
        await settled(client, user, ["hold"])
        stored = [f.content for f in await mw.store.all_for_user(user)]
        redacted = ["".join("#" if c.isdigit() else c for c in s) for s in said]
        leaked = [pin for pin in pins if any(pin in text for text in stored)]
        kept = {line: sum(text.count(line) for text in stored) for line in redacted}
        replies = {r: sum(text.count(r) for text in stored) for r in map(receipt, redacted)}
        assert leaked == [], f"{len(leaked)} of {len(pins)} PINs stored before the redaction"
        assert list(kept.values()) == [1] * len(said), kept
        assert list(replies.values()) == [1] * len(said), replies


def echo(text: str) -> str:
    """The model's reply to the human line `text`: a code of its own, distinct per turn."""
    label = text.split()[0]
    return f"Your one-time code for {label} is {8000 + 7 * ord(label[-1])}."


class EchoDigitsModel(BaseChatModel):
    """Replies with `echo` of the latest human line (its label survives the redaction)."""

    @property
    def _llm_type(self) -> str:
        return "echo-digits"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        human = next(m for m in reversed(messages) if m.type == "human")
        return ChatResult(generations=[ChatGeneration(message=AIMessage(echo(str(human.content))))])


def _hide_digits(text: str) -> str:
    return "".join("#" if c.isdigit() else c for c in text)


@before_model
def redact_by_new_message(state: Any, runtime: Any) -> dict[str, Any] | None:
    """A guardrail that replaces the latest human message by a new object of the same id
    (not a copy: none of memory's stamps come along), digits hidden."""
    message = next(m for m in reversed(state["messages"]) if m.type == "human")
    text = str(message.content)
    if not any(c.isdigit() for c in text):
        return None
    return {"messages": [HumanMessage(content=_hide_digits(text), id=message.id)]}


@after_model
def redact_reply_by_new_message(state: Any, runtime: Any) -> dict[str, Any] | None:
    """The same for the model's reply, after the model call captured it."""
    last = state["messages"][-1]
    if last.type != "ai" or not any(c.isdigit() for c in str(last.content)):
        return None
    return {"messages": [AIMessage(content=_hide_digits(str(last.content)), id=last.id)]}


@pytest.mark.integration
async def test_a_redaction_by_a_new_message_object_keeps_the_original_out_of_memory(
    live_memory: LiveMemory,
) -> None:
    mw, client = live_memory.worker, live_memory.client
    user = f"redact-{uuid.uuid4().hex[:8]}"
    mw.track(client.workflow_id(user))
    memory = DurableMemoryMiddleware(client=client)
    agent = create_agent(
        EchoDigitsModel(), [], middleware=[memory, redact_by_new_message,
        redact_reply_by_new_message], context_schema=Ctx, checkpointer=InMemorySaver(),
    )  # fmt: skip
    said = [f"REDACT-{chr(65 + i)} my card pin is {5200 + 71 * i} for now." for i in range(3)]
    for text in said:
        await agent.ainvoke(
            {"messages": [HumanMessage(text)]},
            {"configurable": {"thread_id": "redact"}},
            context=Ctx(user),
        )
    assert await memory.flush(30) == 0
    await settled(client, user, ["redact"])
    stored = "\n".join(f.content for f in await mw.store.all_for_user(user))
    secrets = [f"{5200 + 71 * i}" for i in range(3)] + [echo(t).split(" is ")[1] for t in said]
    assert [p for p in secrets if p in stored] == [], stored
    lines = [_hide_digits(t) for t in said] + [_hide_digits(echo(t)) for t in said]
    assert {line: stored.count(line) for line in lines} == dict.fromkeys(lines, 1), stored
