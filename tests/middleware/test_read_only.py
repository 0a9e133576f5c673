"""A read-only DurableMemoryMiddleware (`remember=False`) on the dev server with the real worker,
Redis and Milvus Lite: its model calls get the user's memory, and nothing of its turns reaches
the user's workflow (no message, no reinforcement); a remembering agent on the same client,
asked the same way, is the control that shows both would have happened. Then the same thread
continued by both kinds of agent, also from two processes with summarisation in the mix.
"""

from __future__ import annotations

import random
import time

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware
from tests.middleware.test_agent_integration import (
    FACTS,
    ScriptedModel,
    VirtualClock,
    harness,
    new_user,
    stack,
    wait_indexed,
)
from tests.middleware.test_delivery import HOUR, Ctx, line, settled, summarizer
from tests.support.chat import ReceiptModel, receipt
from tests.support.drive import eventually
from tests.support.invariants import leaked_to, said_vs_stored
from tests.support.memory_worker import memory_worker

pytestmark = pytest.mark.integration

ORDER_REPLY = "Your order number is 7734-221 and it has not arrived yet, I am sorry."


@pytest.fixture
def env(dev_env: WorkflowEnvironment) -> WorkflowEnvironment:
    return dev_env


async def test_a_read_only_agent_reads_memory_and_hands_nothing_over(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    async with stack(env, milvus_uri, redis_url) as (mw, client):
        user, clock = new_user("ro"), VirtualClock()
        writer = harness(client, clock=clock)
        for text in FACTS:
            await writer.turn(user, "session-1", text)
        await writer.mw.flush()
        await wait_indexed(client, user, "session-1", 2 * len(FACTS))
        stored = {f.id: f.strengthen_count for f in await mw.store.all_for_user(user)}

        reader = harness(
            client,
            clock=clock,
            remember=False,
            model=ScriptedModel(script=[AIMessage(ORDER_REPLY)]),
        )
        await reader.turn(user, "probe-read-only", "What was my order number again?")
        await reader.turn(
            user, "probe-read-only", "I moved to Leeds last month. Which day am I busy?"
        )
        assert "7734-221" in reader.model.system_prompt(0), "the read-only call got the memory"
        assert "Wednesdays" in reader.model.system_prompt(1)
        assert await reader.mw.flush() == 0

        # The control: the same question and answer through a remembering agent.
        control = harness(client, clock=clock, model=ScriptedModel(script=[AIMessage(ORDER_REPLY)]))
        await control.turn(
            user,
            "probe-remembered",
            "My new phone number is 0171-555-0199. What was my order number?",
        )
        await control.mw.flush()
        await wait_indexed(client, user, "probe-remembered", 2)

        async def reinforced() -> bool:
            now = {f.id: f.strengthen_count for f in await mw.store.all_for_user(user)}
            return any(now.get(i, 0) > n for i, n in stored.items())

        await eventually(reinforced, deadline_s=60, what="the control's reinforcement")
        # The reader's calls quoted the same fragment first (its flush awaited any
        # reinforcement it sent): one step up means only the control's counted.
        now = {f.id: f.strengthen_count for f in await mw.store.all_for_user(user)}
        assert max(now[i] - n for i, n in stored.items()) == 1, "only the control reinforced"
        after = await client.status(user)
        assert after is not None
        assert "probe-read-only" not in after.watermarks, "no read-only message was accepted"
        assert after.watermarks["probe-remembered"].accepted == 2
        assert after.pending_turns == 0 and after.undelivered == 0
        said = " ".join(f.content for f in await mw.store.all_for_user(user))
        assert "0171-555-0199" in said and "Leeds" not in said
        state = await reader.state("probe-read-only")
        assert len(state["messages"]) == 4 and not state.get("memory_accepted")


async def test_what_a_read_only_turn_said_stays_unkept_on_the_same_thread(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """A thread starts read-only, then an agent that remembers goes on with it (one
    checkpointer): only the remembering turns are stored, also after a resync of the thread,
    and the model keeps seeing the read-only lines (they are not trimmed as if indexed)."""
    async with stack(env, milvus_uri, redis_url) as (mw, client):
        user, clock, saver = new_user("mix"), VirtualClock(), InMemorySaver()
        reader = harness(client, clock=clock, saver=saver, remember=False)
        writer = harness(client, clock=clock, saver=saver)
        await reader.turn(user, "mixed", "Off the record: my salary is 91,500 a year.")
        await reader.turn(user, "mixed", "Off the record: I am looking for another job.")
        await writer.turn(user, "mixed", "My dog is called Biscuit and she is three.")
        await writer.turn(user, "mixed", "Biscuit likes the beach at Formby.")
        await writer.mw.flush()
        await wait_indexed(client, user, "mixed", 4)
        status = await client.status(user)
        assert status is not None and status.watermarks["mixed"].accepted == 4

        messages = (await writer.state("mixed"))["messages"]
        assert len(messages) == 8
        result = await client.resync(user, "mixed", messages)
        assert (result.sent, result.skipped) == (4, 4), "none of the read-only turns' messages"
        await writer.turn(user, "mixed", "Thanks.")
        await writer.mw.flush()
        await wait_indexed(client, user, "mixed", 6)

        said = " ".join(f.content for f in await mw.store.all_for_user(user))
        assert "Biscuit" in said and "Formby" in said
        assert "salary" not in said and "91,500" not in said and "another job" not in said
        status = await client.status(user)
        assert status is not None and status.watermarks["mixed"].accepted == 6
        # every message of the thread still reaches the model on the last call
        last_call = writer.model.seen[-1]
        assert any("91,500" in str(m.content) for m in last_call)


async def test_read_only_and_remembering_agents_in_two_processes_share_a_thread(
    env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """What an integrator combines: two agent processes (each its own MemoryClient, outbox and
    middleware), one checkpointer they both continue the thread from, and LangChain's
    summarisation in both, rewriting the list while messages wait for hand-over. Turns
    alternate between the remembering agent and the read-only one, every line distinct: each
    line of the remembering turns is stored exactly once and none of the read-only turns'."""
    rng = random.Random(20261206)
    async with memory_worker(
        env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        user, saver = new_user("two"), InMemorySaver()
        async with mw.memory_client(redis_url) as one, mw.memory_client(redis_url) as two:
            mw.track(one.workflow_id(user))
            clock = {"t": time.time() - 3 * HOUR}
            agents = {}
            for name, client, remember in (("kept", one, True), ("off", two, False)):
                memory = DurableMemoryMiddleware(
                    client=client, clock=lambda: clock["t"], remember=remember
                )
                agents[name] = (
                    memory,
                    create_agent(
                        ReceiptModel(),
                        [],
                        middleware=[memory, summarizer()],
                        context_schema=Ctx,
                        checkpointer=saver,
                    ),
                )
            said: dict[str, list[str]] = {"kept": [], "off": []}
            for i in range(16):
                name = "kept" if i % 2 == 0 else "off"
                text = line(rng, i, name)
                clock["t"] += 40.0
                result = await agents[name][1].ainvoke(
                    {"messages": [HumanMessage(text)]},
                    {"configurable": {"thread_id": "shared"}},
                    context=Ctx(user),
                )
                assert result["messages"][-1].content == receipt(text), "the turn went on"
                said[name] += [text, receipt(text)]
            state = await agents["kept"][1].aget_state({"configurable": {"thread_id": "shared"}})
            kept = state.values["messages"]
            assert kept[0].additional_kwargs.get("lc_source") == "summarization"
            for memory, _agent in agents.values():
                assert await memory.flush() == 0
            status = await settled(one, user, ["shared"])
            outcome = await said_vs_stored(mw.store, user, status, {"shared": said["kept"]})
            assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
            assert status.watermarks["shared"].accepted == len(said["kept"]) == 16
            leaked = await leaked_to(mw.store, user, said["off"])
            assert leaked.duplicated == 0, "a read-only line was stored"
