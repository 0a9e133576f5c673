"""Bad input at the agent's side, on the dev server with the real worker, Redis and Milvus Lite.

Each gets a clear error where the caller can act on it, or goes through whole: nothing lost
(every other message indexed), nothing leaked (no other user's fragments readable).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.middleware.payloads import MAX_EVENT_BYTES
from mnemoflow.models.ids import MAX_THREAD_ID_CHARS, thread_key, user_workflow_id
from tests.support.drive import conversation, eventually
from tests.support.invariants import indexed_once, no_messages, refused_or_stored
from tests.support.memory_worker import memory_worker
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

HOUR = 3600.0
TAG = uuid.uuid4().hex[:6]
ODD_IDS = {
    "quotes": f'o\'brien "the" {TAG}',
    "backslashes": f"dom\\ain\\user\\{TAG}",
    "slashes": f"tenant/42/user/{TAG}",
    "spaces": f"  ada  lovelace {TAG} ",
    "unicode": f"用户-Ünïcødé-🦜-{TAG}",
    "1,200 chars": f"{TAG}-" + "x" * 1200,
    "filter breakout": f'x" or user_key != "{TAG}',
    "filter breakout '": f"x' || 1 == 1 || '{TAG}",
}


@dataclass
class Ctx:
    user_id: Any


class ToolThenDone(BaseChatModel):
    """Calls the `fetch_log` tool once per turn, then answers "done"."""

    calls: list[int] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "tool-then-done"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolThenDone:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.calls.append(len(messages))
        if messages[-1].type == "tool":
            reply = AIMessage("done")
        else:
            call = {"name": "fetch_log", "args": {}, "id": f"call-{len(self.calls)}"}
            reply = AIMessage("", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def fetch_log() -> str:
    """Return the full server log (5 MB)."""
    return "log line with nothing to remember\n" * (5_000_000 // 34)


def _agent_three_hours_ago(mw: Any) -> tuple[MemoryClient, DurableMemoryMiddleware, Any]:
    """An agent whose messages are stamped three hours ago (so rounds are due at once), with
    the fetch_log tool and an in-memory checkpointer."""
    client = mw.memory_client()
    middleware = DurableMemoryMiddleware(client=client, clock=lambda: time.time() - 3 * HOUR)
    agent = create_agent(
        ToolThenDone(), [fetch_log], middleware=[middleware], context_schema=Ctx,
        checkpointer=InMemorySaver(),
    )  # fmt: skip
    return client, middleware, agent


async def wait_indexed(client: MemoryClient, user: str, thread: str, end: int) -> Any:
    box: dict[str, Any] = {}

    async def check() -> bool:
        box["s"] = await client.status(user)
        s = box["s"]
        return bool(s and thread in s.watermarks and s.watermarks[thread].indexed >= end)

    await eventually(check, deadline_s=60, what=f"{user[:40]!r} indexed to {end}")
    return box["s"]


async def test_odd_user_ids_work_and_a_crafted_one_reads_nobody_elses_fragments(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = mw.memory_client()
        victim = f"victim-{TAG}"
        users = {"victim": victim, **ODD_IDS}
        t0 = time.time() - 3 * HOUR
        for i, user in enumerate(users.values()):
            mw.track(user_workflow_id(user))
            lines = [f"My locker code is {7000 + i} and my order is X{i}.", "Noted."]
            await client.submit(user, conversation("t", lines, t0), urgent=True)
        statuses = await asyncio.gather(*(wait_indexed(client, u, "t", 2) for u in users.values()))
        outcome = no_messages()
        for (label, user), status in zip(users.items(), statuses, strict=True):
            outcome += await indexed_once(mw.store, user, status, {"t": 2})
            own = {f.id for f in await mw.store.all_for_user(user)}
            assert own, f"{label}: nothing stored"
            found = await client.recall(user, "locker code order", top_k=50)
            assert found.fragments and {f.id for f in found.fragments} <= own, label
            context = await client.context(user)
            assert context is not None and {f.id for f in context.fragments} <= own, label
        victim_ids = {f.id for f in await mw.store.all_for_user(victim)}
        for label in ("filter breakout", "filter breakout '"):
            recalled = await client.recall(ODD_IDS[label], "locker code order", top_k=50)
            assert not {f.id for f in recalled.fragments} & victim_ids
            assert len(recalled.fragments) == len(await mw.store.all_for_user(ODD_IDS[label]))
        assert outcome.clean, outcome
        with pytest.raises(ValueError, match="at most"):
            await client.submit("y" * 5000, conversation("t", ["hi"], t0))
        with pytest.raises(ValueError, match="NUL"):
            await client.submit("nul\x00id", conversation("t", ["hi"], t0))
        await client.aclose()
    reliability.record(
        request,
        key="odd-user-ids",
        kind="bad input",
        what="User ids with quotes, backslashes, slashes, spaces, unicode, 1,200 characters, and "
        'two crafted to break out of a Milvus filter (`x" or user_key != "…`, `x\' || 1 == 1 '
        "|| '…`)",
        happened="each user's turns indexed under its own hashed user_key; recall, select and the "
        "read model returned only its own fragments; the crafted ids read none of another "
        "user's; ids over 4,096 characters or with NUL rejected with ValueError",
        outcome=outcome,
        started=started,
    )


async def test_missing_user_id_is_a_clear_error_at_the_turn(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client = mw.memory_client()
        agent = create_agent(
            ToolThenDone(), [], middleware=[DurableMemoryMiddleware(client=client)],
            checkpointer=InMemorySaver(),
        )  # fmt: skip
        config = {"configurable": {"thread_id": "t"}}
        said, refused = ["hello"], []
        with pytest.raises(ValueError, match="needs a user id"):
            await agent.ainvoke({"messages": [HumanMessage("hello")]}, config)
        refused.append("hello")
        for bad in ("", "   ", 42):
            text = f"hi, my id is {bad!r}"
            said.append(text)
            with pytest.raises(ValueError, match="user id"):
                await agent.ainvoke({"messages": [HumanMessage(text)]}, config, context=Ctx(bad))
            refused.append(text)
        listed = [w async for w in dev_env.client.list_workflows(f"TaskQueue = '{mw.task_queue}'")]
        assert listed == [], "a workflow was started for a missing user"
        # No workflow, so no user's rows: nothing said can be stored anywhere.
        outcome = refused_or_stored(said, refused, stored=[])
        assert outcome.clean, outcome
        await client.aclose()
    reliability.record(
        request,
        key="missing-user-id",
        kind="bad input",
        what="Missing user id; empty, blank and non-string user ids",
        happened="ValueError at the turn naming where to pass the id (runtime context or "
        "state['user_id']); no shared default bucket, no workflow started",
        outcome=outcome,
        started=started,
    )


async def test_empty_and_non_text_messages_and_a_5mb_tool_output(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client, middleware, agent = _agent_three_hours_ago(mw)
        user, config = f"inputs-{TAG}", {"configurable": {"thread_id": "t"}}
        mw.track(user_workflow_id(user))
        image = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
        inputs = [
            HumanMessage("My name is Ada and my order number is 55120."),
            HumanMessage(""),
            HumanMessage(content=image),  # type: ignore[arg-type]
            HumanMessage("Please fetch the server log for order 55120."),
            # a lone surrogate (half an emoji from a bad decoder), in the text and the name
            HumanMessage("My parrot Kiwi \ud83e is 3 years old.", name="Ada \udc00"),
        ]
        result: dict[str, Any] = {}
        for message in inputs:
            result = await agent.ainvoke({"messages": [message]}, config, context=Ctx(user))
            assert result["messages"][-1].content == "done"  # every turn went on
        await middleware.flush()
        messages = result["messages"]
        tool_output = next(m for m in messages if m.type == "tool")
        assert len(tool_output.content) > 4_900_000  # the agent's own state keeps it whole
        status = await wait_indexed(client, user, "t", len(messages))
        outcome = await indexed_once(mw.store, user, status, {"t": len(messages)})
        assert (outcome.lost, outcome.duplicated) == (0, 0), outcome
        stored = " ".join(f.content for f in await mw.store.all_for_user(user))
        assert "55120" in stored
        assert "My parrot Kiwi \ufffd is 3 years old." in stored  # kept, the half emoji replaced
        assert len(stored.encode()) < MAX_EVENT_BYTES  # only a bounded prefix reached Temporal
        await client.aclose()
    reliability.record(
        request,
        key="empty-nontext-5mb",
        kind="bad input",
        what="An empty message, an image-only message, a 5 MB tool output and a message with "
        "a lone surrogate in one thread",
        happened="every turn answered; the tool output was trimmed to a bounded prefix before "
        f"Temporal (the agent's state keeps it whole); all {len(messages)} messages indexed "
        "once, the order number remembered",
        outcome=outcome,
        started=started,
    )


async def test_long_thread_ids_key_their_own_thread_and_never_fail_a_turn(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    async with memory_worker(
        dev_env.client, milvus_uri=milvus_uri, redis_url=redis_url, models=HeuristicMemoryModels()
    ) as mw:
        client, middleware, agent = _agent_three_hours_ago(mw)
        user = f"threads-{TAG}"
        mw.track(user_workflow_id(user))
        head = "slack:T024BE7LD:C0123ABCD:" + "p" * 600  # one long head shared by both threads
        threads = {f"{head}:A": "My locker code is 4417.", f"{head}:B": "My locker code is 9052."}
        counts: dict[str, int] = {}
        for raw, line in threads.items():
            config = {"configurable": {"thread_id": raw}}
            message = {"messages": [HumanMessage(line)]}
            result = await agent.ainvoke(message, config, context=Ctx(user))
            assert result["messages"][-1].content == "done"  # the turn went on
            counts[thread_key(raw)] = len(result["messages"])
        await middleware.flush()
        assert len(set(counts)) == 2 and all(len(k) <= MAX_THREAD_ID_CHARS + 40 for k in counts)
        for raw in threads:
            await client.consolidate(user, raw)  # the raw id names the same thread
        for key, n in counts.items():
            status = await wait_indexed(client, user, key, n)
        for key, n in counts.items():  # both settled: no round of one runs beside the other
            status = await wait_indexed(client, user, key, n)
        outcome = await indexed_once(mw.store, user, status, counts)
        assert outcome.clean, outcome
        stored = " ".join(f.content for f in await mw.store.all_for_user(user))
        assert "4417" in stored and "9052" in stored
        await client.aclose()
    reliability.record(
        request,
        key="long-thread-ids",
        kind="bad input",
        what="Two 630-character thread ids that differ only at the end, through create_agent",
        happened="both turns answered; each thread keyed by its head plus a hash of the whole "
        "id (models.ids.thread_key), indexed once under its own key; consolidate takes the raw "
        "id",
        outcome=outcome,
        started=started,
    )
