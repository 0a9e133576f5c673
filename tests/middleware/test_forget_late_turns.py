"""What a forget covers stays forgotten however late it is delivered (docs/ARCHITECTURE.md,
"Invariants": forget; patch `forget-covers-late-turns`). Three paths used to store it again:

- unstamped copies re-sent through `resync` after a forget (an app restoring a thread from its
  own database, which keeps no memory stamps): they had new identities and the time of the
  re-send, so the fence let them through;
- a reply quoting a memory, still in its agent's outbox when another client forgot that memory
  with its quotes: the forget cut only what had reached the workflow;
- a model reply made after a whole-user forget, in a turn that began before it: stamped after the
  fence, it was stored while the question it answered was refused.

Each counts what was said against what was stored, with distinct content per user and turn, on a
real worker (dev server, Milvus Lite, redis-server) and the production middleware.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from tests.middleware.test_delivery import Writer, settled
from tests.middleware.test_forget_other_client import (
    Agent,
    detail,
    marks,
    shows,
    two_clients,
)
from tests.support.drive import eventually
from tests.support.invariants import said_vs_stored
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

HOUR = 3600.0


async def stored_text(mw: Any, user: str) -> str:
    return " ".join(f.content for f in await mw.store.all_for_user(user))


async def test_unstamped_copies_resynced_after_a_forget_stay_forgotten(
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
            user = f"resync-{tag}"
            mw.track(client.workflow_id(user))
            writer = Writer(client, [], True, time.time() - 2 * HOUR)
            before = [f"My bike lock code is {tag}-{n}{n}{n}, note it." for n in range(3)]
            for text in before:
                await writer.say(user, "home", text)
            assert await writer.memory.flush() == 0
            await settled(client, user, ["home"])
            assert tag in await stored_text(mw, user)
            await client.forget(user, reason="user asked")
            writer.clock = time.time() + 5  # said after the forget
            after = [f"Ship order {tag}-A{n} to the office desk {n}." for n in range(2)]
            said_after: list[str] = []
            for text in after:
                said_after += [text, await writer.say(user, "home", text)]
            assert await writer.memory.flush() == 0
            # The app restores the thread from its own database: ids and words, no stamps.
            config = {"configurable": {"thread_id": "home"}}
            kept = (await writer.agent.aget_state(config)).values["messages"]
            with_ids = [type(m)(content=m.content, id=m.id) for m in kept]
            without_ids = [type(m)(content=m.content) for m in kept]
            first = await client.resync(user, "home", with_ids)
            second = await client.resync(user, "home", without_ids)
            assert first.unstamped == len(with_ids) and second.unstamped == len(without_ids)
            status = await settled(client, user, ["home"])
            text = await stored_text(mw, user)
            resurrected = sum(line in text for line in before)
            outcome = await said_vs_stored(
                mw.store, user, status, {"home": said_after}, forgotten=before
            )
    assert resurrected == 0, text
    assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
    # The copies without ids cannot be matched: refused, and counted where an operator sees it.
    assert status.refused_after_forget >= len(without_ids) - len(said_after)
    reliability.record(
        request,
        key="forget-resync-unstamped",
        kind="fault",
        what="3 lines said, stored, the user forgotten, 2 more lines said; then the app resyncs "
        "the thread from its own database twice: copies with ids but no stamps, and copies "
        "with neither",
        happened=f"copies known by id and text ({first.sent} re-sent) were no-ops; copies "
        f"without ids had no time stamp and were refused ({status.refused_after_forget} "
        f"counted in status); {resurrected} forgotten lines back, the {len(said_after)} lines "
        "said after the forget stored once",
        outcome=outcome,
        started=started,
    )


async def test_a_thread_restored_unstamped_into_the_agent_after_a_forget_stays_forgotten(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The same copies restored into a new process's graph state instead (no resync): the
    middleware stamps them at the next turn with its clock, but marks that it cannot know when
    they were said, so the forgotten user's workflow refuses them; the new turn is stored."""
    tag = uuid.uuid4().hex[:8]
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        async with mw.memory_client(redis_url) as client:
            user = f"restore-{tag}"
            mw.track(client.workflow_id(user))
            writer = Writer(client, [], True, time.time() - 2 * HOUR)
            before = [f"My boat mooring number is {tag}-{n}{n}, berth {n}." for n in range(3)]
            for text in before:
                await writer.say(user, "dock", text)
            assert await writer.memory.flush() == 0
            await settled(client, user, ["dock"])
            await client.forget(user, reason="user asked")
            config = {"configurable": {"thread_id": "dock"}}
            kept = (await writer.agent.aget_state(config)).values["messages"]
            restarted = Writer(client, [], True, time.time() + 5)  # a new process, after it
            copies = [type(m)(content=m.content) for m in kept]  # the app's rows: words only
            await restarted.agent.aupdate_state(config, {"messages": copies})
            newer = f"Move my boat {tag} to the east pontoon."
            said_after = [newer, await restarted.say(user, "dock", newer)]
            assert await restarted.memory.flush() == 0
            status = await settled(client, user, ["dock"])
            text = await stored_text(mw, user)
            outcome = await said_vs_stored(mw.store, user, status, {"dock": said_after})
    assert not any(line in text for line in before), text
    assert (outcome.lost, outcome.duplicated) == (0, 0), (outcome, text)
    assert status.refused_after_forget >= len(copies)


@pytest.mark.parametrize("quotes", [True, False], ids=["with-quotes", "the-fragment-only"])
async def test_a_reply_quoting_a_memory_still_in_the_outbox_loses_it_when_forgotten_elsewhere(
    quotes: bool,
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):
        rows = [f for f in await mw.store.all_for_user(user) if shows(f.content, user, 2)]
        assert rows, "detail 2 was not stored: nothing to forget"

        @tool
        async def check_unit(ref: str) -> str:
            """Look a unit up (meanwhile another client forgets detail 2)."""
            for row in rows:
                result = await other.forget_fragment(user, row.id, quotes=quotes)
                assert result.deleted == 1
            return f"unit {ref}: in use"

        agent = Agent(client, [check_unit])
        call = {"name": "check_unit", "args": {"ref": "r2"}, "id": "call-2", "type": "tool_call"}
        reply = f"You told me before: {detail(user, 2)} Let me check the unit."
        agent.model.script = [AIMessage(reply, tool_calls=[call]), AIMessage("The unit is free.")]
        prompts = await agent.ask(user, "asks", f"What is the gate code of unit {user}-2?")
        assert shows(prompts[0], user, 2), "detail 2 was not injected: the reply quotes nothing"
        assert await agent.memory.flush() == 0
        status = await settled(client, user, ["asks"])
        text = await stored_text(mw, user)
        back = shows(text, user, 2)
        kept = ["You told me before:", "The unit is free.", "Let me check the unit."]
        lost = sum(k not in text for k in kept)
        kept_details = [n for n in (1, 3) if len(shows(text, user, n)) == 3]
        outcome = await said_vs_stored(
            mw.store, user, status, {"asks": kept}, forgotten=marks(user, 2)
        )
    assert back == [], text
    assert (outcome.lost, outcome.duplicated) == (0, 0), (outcome, text)
    assert lost == 0, text
    assert kept_details == [1, 3]  # what was not forgotten stays
    reliability.record(
        request,
        key=f"forget-quoted-reply-in-outbox{'' if quotes else '-plain'}",
        kind="fault",
        what="A model reply reads an injected memory back; while it waits in the agent's "
        "outbox (the turn is still running) another client forgets that memory "
        f"({'with its quotes' if quotes else 'the fragment only'})",
        happened="the reply carried which injected fragment's words it quotes; the workflow "
        f"cut them on arrival ({len(back)} forgotten words stored; the reply's other "
        f"words kept, {status.watermarks['asks'].indexed} lines indexed)",
        outcome=outcome,
        started=started,
    )


async def test_a_reply_made_after_a_whole_forget_in_a_turn_begun_before_is_not_stored(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):

        @tool
        async def check_unit(ref: str) -> str:
            """Look a unit up (meanwhile another client forgets the user)."""
            await other.forget(user, reason="test")
            return f"unit {ref}: in use"

        agent = Agent(client, [check_unit])
        call = {"name": "check_unit", "args": {"ref": "r1"}, "id": "call-1", "type": "tool_call"}
        agent.model.script = [
            AIMessage("", tool_calls=[call]),
            AIMessage(f"From what you told me: {detail(user, 1)}"),  # made after the forget
        ]
        prompts = await agent.ask(user, "asks", f"What is the gate code of unit {user}-1?")
        assert shows(prompts[0], user, 1), "detail 1 not injected before the forget"
        # A turn begun after the forget is the user's new memory.
        newer = f"My new storage unit is {user}-9, gate code 4242."
        agent.model.script = [AIMessage("Noted the new unit.")]
        await agent.ask(user, "asks", newer)
        assert await agent.memory.flush() == 0
        status = await settled(client, user, ["asks"])
        text = await stored_text(mw, user)
        back = {n: shows(text, user, n) for n in (1, 2, 3)}
        outcome = await said_vs_stored(
            mw.store,
            user,
            status,
            {"asks": [newer, "Noted the new unit."]},
            forgotten=[m for n in (1, 2, 3) for m in marks(user, n)],
        )
    assert not any(back.values()), text
    assert (outcome.lost, outcome.duplicated) == (0, 0), (outcome, text)
    # The tool result and the reply of that turn: refused by the forget epoch they carry
    # (read at the turn's start), or as the rest of a turn whose question the forget refused.
    assert status.refused_stale + status.refused_after_forget >= 2, status
    reliability.record(
        request,
        key="forget-whole-reply-after-in-turn",
        kind="fault",
        what="A turn's first model call injects a memory, its tool call waits while another "
        "client forgets the user, then the turn's last reply reads the memory back; one more "
        "turn after the forget",
        happened="the forget refused the turn's question (said before it) and, by the turn "
        f"each message carries, the tool result and the reply made after it "
        f"({status.refused_stale + status.refused_after_forget} refused); 0 forgotten lines "
        "stored; the next turn stored whole",
        outcome=outcome,
        started=started,
    )


async def test_a_delivered_reply_waiting_for_its_round_loses_a_memory_forgotten_meanwhile(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """The same reply, delivered before the forget but not stored yet (its round not due): a
    forget of the fragment alone cuts the words the reply took from it."""
    async with two_clients(dev_env, milvus_uri, redis_url) as (mw, user, other, client):
        rows = [f for f in await mw.store.all_for_user(user) if shows(f.content, user, 3)]
        assert rows, "detail 3 was not stored: nothing to forget"
        agent = Agent(client)
        agent.model.script = [AIMessage(f"Yes: {detail(user, 3)} Anything else today?")]
        prompts = await agent.ask(user, "waits", f"What is the gate code of unit {user}-3?")
        assert shows(prompts[0], user, 3), "detail 3 was not injected"
        assert await agent.memory.flush() == 0

        async def waiting() -> bool:  # delivered, its round not due
            status = await client.status(user)
            return status is not None and status.pending_turns >= 2

        await eventually(waiting, deadline_s=30, what="the reply accepted, waiting for its round")
        for row in rows:
            assert (await other.forget_fragment(user, row.id)).deleted == 1
        await settled(client, user, ["waits"])
        text = await stored_text(mw, user)
    assert shows(text, user, 3) == [], text
    assert "Anything else today?" in text and f"unit {user}-3?" in text
