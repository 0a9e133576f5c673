"""Callers' time stamps on the dev server with the real worker, Redis and Milvus Lite: stamps in
milliseconds, microseconds or nanoseconds, a caller's clock ahead of the agent host's, datetime
and ISO-8601 stamps, and a thread pruned while its newest stamp is ahead of the workflow's clock
(docs/ARCHITECTURE.md, "Message identity").

Each counts what was said against what the user's memory stored (every line distinct), and
checks the user workflow never failed a task.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from mnemoflow.middleware import DurableMemoryMiddleware
from mnemoflow.workflows import state_ops
from tests.middleware.conftest import LiveMemory
from tests.support.chat import ReceiptModel, receipt
from tests.support.drive import eventually
from tests.support.replay import assert_replays

pytestmark = pytest.mark.integration

DAY = 86_400.0


@dataclass
class Ctx:
    user_id: str


async def task_failures(client: Client, workflow_id: str) -> list[str]:
    """The failure messages of the workflow's failed workflow tasks (current run)."""
    out = []
    async for ev in client.get_workflow_handle(workflow_id).fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            out.append(ev.workflow_task_failed_event_attributes.failure.message[:300])
    return out


async def stored(live: LiveMemory, user: str) -> list[Any]:
    return await live.worker.store.all_for_user(user)


def counts(texts: list[str], lines: list[str]) -> dict[str, int]:
    return {line: sum(t.count(line) for t in texts) for line in lines}


def agent(live: LiveMemory) -> tuple[Any, DurableMemoryMiddleware]:
    memory = DurableMemoryMiddleware(client=live.client)
    graph = create_agent(
        ReceiptModel(), [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    return graph, memory


class Clock:
    """Advances 7 s a call, from three hours ago (every stamp distinct, mature at once)."""

    def __init__(self) -> None:
        self.t = time.time() - 3 * 3600

    def __call__(self) -> float:
        self.t += 7.0
        return self.t


UNITS = {"ms": 1e3, "us": 1e6, "ns": 1e9}


@pytest.mark.parametrize("unit", ["ms", "us", "ns"])
async def test_a_history_stamped_in_finer_units_is_dated_right_and_the_workflow_lives(
    live_memory: LiveMemory, unit: str
) -> None:
    """Imported history stamped in JS milliseconds, microseconds or `time.time_ns()`: before,
    a micro/nanosecond stamp overflowed the workflow's timer and failed every task (status,
    settle, recall, remember refused forever); a millisecond one waited 50,000 years."""
    live = live_memory
    user = live.new_user(f"unit-{unit}")
    now = time.time()
    stamp = now * UNITS[unit] if unit != "ns" else time.time_ns()
    said = f"IMPORT-{unit}: my gym badge is {4417 + len(unit)}."
    imported = [
        HumanMessage(said, id="imp-h", additional_kwargs={"time": stamp}),
        AIMessage(receipt(said), id="imp-a", additional_kwargs={"time": stamp + UNITS[unit]}),
    ]
    sent = await live.client.resync(user, "imported", imported)
    assert sent.sent == 2

    async def accepted() -> bool:
        s = await live.client.status(user)
        return s is not None and "imported" in s.watermarks

    await eventually(accepted, what="the import accepted")
    mark = (await live.client.status(user)).watermarks["imported"]  # type: ignore[union-attr]
    assert mark.pending_since is not None and abs(mark.pending_since - now) < 5, mark

    graph, memory = agent(live)
    line = f"LIVE-{unit}: my parking spot is B-{len(unit) * 7}."
    await graph.ainvoke(
        {"messages": [HumanMessage(line)]},
        {"configurable": {"thread_id": "live"}},
        context=Ctx(user),
    )
    assert await memory.flush(10) == 0
    for thread in ("imported", "live"):
        await live.client.consolidate(user, thread)
    await live.client.settle(user, 60)
    assert await task_failures(live.worker.client, live.client.workflow_id(user)) == []
    frags = await stored(live, user)
    lines = [said, receipt(said), line, receipt(line)]
    assert counts([f.content for f in frags], lines) == dict.fromkeys(lines, 1)
    dated = [f.created_at for f in frags if said in f.content]
    assert dated and all(abs(t - now) < 5 for t in dated), dated


async def test_an_agent_line_stamped_with_time_ns_is_a_line_of_now(
    live_memory: LiveMemory,
) -> None:
    """The agent path alone: 63 lines said three hours ago (the middleware's clock) and one
    stamped `time.time_ns()`. The first round, due at once, takes the 64 oldest; before, the
    nanosecond line was left pending alone and its timer failed every workflow task."""
    live = live_memory
    user = live.new_user("ns-agent")
    memory = DurableMemoryMiddleware(client=live.client, clock=Clock())
    graph = create_agent(
        ReceiptModel(), [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    lines = [f"NSA-{n:02d}: item {n} costs {n * 3 + 1} euros." for n in range(63)]
    msgs = [HumanMessage(line) for line in lines]
    ns_line = "NSA-NS: my ferry ticket is F-2207."
    msgs.append(HumanMessage(ns_line, additional_kwargs={"time": time.time_ns()}))
    await graph.ainvoke(
        {"messages": msgs}, {"configurable": {"thread_id": "bulk"}}, context=Ctx(user)
    )
    assert await memory.flush(10) == 0

    async def first_round() -> bool:
        s = await live.client.status(user, timeout_s=5)
        return s is not None and s.rounds_completed >= 1

    await eventually(first_round, deadline_s=60, what="the round due at once")
    s = await live.client.status(user)
    assert s is not None and s.watermarks["bulk"].pending_since is not None
    assert abs(s.watermarks["bulk"].pending_since - time.time()) < 60, s.watermarks
    await live.client.consolidate(user, "bulk")
    await live.client.settle(user, 60)
    assert await task_failures(live.worker.client, live.client.workflow_id(user)) == []
    said = [*lines, ns_line, receipt(ns_line)]
    texts = [f.content for f in await stored(live, user)]
    assert counts(texts, said) == dict.fromkeys(said, 1)


@pytest.mark.parametrize("skew", ["plus30s", "plus2h", "ms"])
async def test_answers_stay_after_their_questions_when_the_caller_clock_runs_ahead(
    live_memory: LiveMemory, skew: str
) -> None:
    """The caller stamps each human line with its own clock, ahead of the agent host's; the
    middleware stamps the replies. Rounds order by (time, position): before, every answer was
    stamped before its question and stored ahead of it."""
    live = live_memory
    user = live.new_user(f"order-{skew}")
    graph, memory = agent(live)
    humans = [
        f"ORD-{skew}-{n}: my seat for show {n} is row {n + 3} seat {n * 7 + 2}." for n in range(3)
    ]
    for h in humans:
        now = time.time()
        stamp = {"plus30s": now + 30, "plus2h": now + 7200, "ms": now * 1000}[skew]
        await graph.ainvoke(
            {"messages": [HumanMessage(h, additional_kwargs={"time": stamp})]},
            {"configurable": {"thread_id": "o"}},
            context=Ctx(user),
        )
    assert await memory.flush(10) == 0
    await live.client.consolidate(user, "o")
    await live.client.settle(user, 60)
    text = "\n".join(f.content for f in await stored(live, user))
    for h in humans:
        assert text.count(f"User: {h}") == 1 and text.count(receipt(h)) == 1, text
        assert text.find(f"User: {h}") < text.find(f"Assistant: {receipt(h)}"), text


@pytest.mark.parametrize("form", ["iso-z", "iso-offset", "iso-naive", "datetime", "naive"])
async def test_datetime_and_iso_stamps_are_their_instant(
    live_memory: LiveMemory, form: str
) -> None:
    """A datetime or an ISO-8601 string is the instant it names (naive: UTC); before, it was
    silently replaced by the host's clock. Two lines a minute apart, three days ago: their
    fragment is dated by the later one."""
    live = live_memory
    user = live.new_user(f"iso-{form}")
    base = int(time.time() - 3 * DAY)
    local = datetime.now().astimezone().tzinfo

    def stamp(at: datetime) -> Any:
        return {
            "iso-z": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "iso-offset": at.astimezone(local).isoformat(),
            "iso-naive": at.replace(tzinfo=None).isoformat(),
            "datetime": at,
            "naive": at.replace(tzinfo=None),
        }[form]

    moments = [datetime.fromtimestamp(base + 60 * n, UTC) for n in range(2)]
    lines = [f"ISO-{form}-{n}: my locker code is {len(form) * 111 + n}." for n in range(2)]
    messages = [
        HumanMessage(line, id=f"d{n}", additional_kwargs={"time": stamp(at)})
        for n, (line, at) in enumerate(zip(lines, moments, strict=True))
    ]
    assert (await live.client.resync(user, "d", messages)).sent == 2
    await live.client.consolidate(user, "d")
    await live.client.settle(user, 60)
    frags = await stored(live, user)
    assert counts([f.content for f in frags], lines) == dict.fromkeys(lines, 1)
    dated = [f.created_at for f in frags if lines[1] in f.content]
    assert dated == [moments[1].timestamp()], (dated, moments[1])


async def test_a_thread_pruned_while_stamped_ahead_takes_new_lines(
    live_memory: LiveMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thread V's first line is stamped an hour ahead (a caller's skewed clock). V is indexed,
    then other threads make it the idle thread the workflow prunes; its horizon was that future
    stamp, so what the user said next on V (stamped now) was silently refused. The bound is
    lowered from 200 threads to 3 (the workflow reads it from the state_ops module)."""
    monkeypatch.setattr(state_ops, "MAX_IDLE_THREADS", 3)
    live = live_memory
    user = live.new_user("horizon")
    wid = live.client.workflow_id(user)
    graph, memory = agent(live)
    cfg = {"configurable": {"thread_id": "victim"}}
    first = "HZ-1: my desk number is 3318."
    ahead = {"time": time.time() + 3600}
    await graph.ainvoke(
        {"messages": [HumanMessage(first, additional_kwargs=ahead)]}, cfg, context=Ctx(user)
    )
    assert await memory.flush(10) == 0
    await live.client.consolidate(user, "victim")
    await live.client.settle(user, 60)
    old = time.time() - 3 * 3600
    others = [f"OTHER-{i}: filler code {10000 + i}." for i in range(4)]
    for i, text in enumerate(others):  # mature at once: indexed by their own rounds
        msg = HumanMessage(text, id=f"o{i}", additional_kwargs={"time": old + i})
        await live.client.resync(user, f"other-{i}", [msg])
    s = await live.client.settle(user, 120)
    assert s is not None and "victim" not in s.watermarks, "the thread was not pruned"
    second = "HZ-2: my new desk number is 4427."
    await graph.ainvoke({"messages": [HumanMessage(second)]}, cfg, context=Ctx(user))
    assert await memory.flush(10) == 0
    await live.client.consolidate(user, "victim")
    s = await live.client.settle(user, 60)
    mark = None if s is None else s.watermarks.get("victim")
    assert mark is not None and mark.accepted == 2, mark  # before: both refused
    texts = [f.content for f in await stored(live, user)]
    lines = [first, receipt(first), second, receipt(second), *others]
    assert counts(texts, lines) == dict.fromkeys(lines, 1)
    assert await task_failures(live.worker.client, wid) == []
    await assert_replays(live.worker.client, [wid], name="horizon-at-now")


@pytest.mark.integration
async def test_threads_bounded_while_stamps_in_ms_were_read_as_seconds_take_new_lines(
    live_memory: LiveMemory,
) -> None:
    """Before stamps were scaled, a JavaScript client's Date.now() (~1.7e12) was read as seconds:
    a thread bounded or pruned then carries a horizon 50,000 years ahead into its continued
    state, and after the upgrade every line on it, now read in seconds, was refused (0 of 10
    stored). The state is given as a continue-as-new of such a run carries it."""
    from mnemoflow.models.contracts import ThreadState, UserMemoryState
    from mnemoflow.models.turns import identity_digest
    from mnemoflow.workflows.user_memory import UserMemoryWorkflow

    client = live_memory.client
    user = live_memory.new_user("ms-era")
    ms_era = (time.time() - 3600) * 1000
    state = UserMemoryState(
        threads={"t": ThreadState(accepted=5000, indexed=5000, horizon=ms_era)},
        retired_threads={identity_digest("old"): ms_era},
    )
    inp = client._input(user).model_copy(update={"state": state})
    await client.temporal.start_workflow(
        UserMemoryWorkflow.run, inp, id=client.workflow_id(user), task_queue=client.task_queue
    )
    memory = DurableMemoryMiddleware(client=client)
    agent = create_agent(
        ReceiptModel(), [], middleware=[memory], context_schema=Ctx, checkpointer=InMemorySaver()
    )
    said: list[str] = []
    for thread in ("t", "old"):
        for n in range(3):
            line = f"MS-{thread}-{n}: my locker {thread} {n} code is {4100 + n * 13}."
            stamp = {"time": time.time() * 1000}  # the same client: Date.now()
            said += [line, receipt(line)]
            await agent.ainvoke(
                {"messages": [HumanMessage(line, additional_kwargs=stamp)]},
                {"configurable": {"thread_id": thread}},
                context=Ctx(user),
            )
        line = f"MS-{thread}-plain: my bike {thread} frame is {7300 + len(thread)}."
        said += [line, receipt(line)]
        await agent.ainvoke(
            {"messages": [HumanMessage(line)]}, {"configurable": {"thread_id": thread}},
            context=Ctx(user),
        )  # fmt: skip
    assert await memory.flush(30) == 0
    for thread in ("t", "old"):
        await client.consolidate(user, thread)
    await client.settle(user, 90)
    stored = "\n".join(f.content for f in await live_memory.worker.store.all_for_user(user))
    assert [stored.count(line) for line in said] == [1] * len(said)
