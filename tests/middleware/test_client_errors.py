"""MemoryClient's errors, and the memory tools inside a real agent turn, when memory does not
answer: an update nobody answers in time (no worker polling the queue; Milvus down under a real
worker, so the update's activity keeps retrying) is a MemoryUnavailableError, never temporalio's
raw error, and a tool call then tells the model memory is unavailable within the client's
`tool_timeout_s`: the turn goes on (README: "the turn never fails because memory is down").

Also the arguments the client refuses before any call to Temporal: a text to remember that is
not a str, fragment types that are not a list of known types, a forget reason the request
refuses, a non-positive timeout, and retry_round of an unknown event id (its docstring promises
a ValueError)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import LOOPBACK, free_port, start_milvus_lite
from mnemoflow.middleware import MemoryClient, memory_tools
from mnemoflow.middleware.tools import (
    FORGET_PENDING,
    FORGET_UNCONFIRMED,
    UNAVAILABLE,
    UNCONFIRMED,
)
from mnemoflow.models.config import FRAGMENT_TYPES
from mnemoflow.models.errors import InvalidInputError, MemoryUnavailableError
from tests.middleware.conftest import LiveMemory
from tests.middleware.test_agent_integration import ScriptedModel, harness, tool_call
from tests.support.drive import conversation
from tests.support.memory_worker import memory_worker

pytestmark = pytest.mark.integration


def _tool_turn_script(tag: str) -> list[AIMessage]:
    """A model that calls every memory tool that needs an update, then answers."""
    return [
        tool_call("recall_memories", {"query": "bike"}),
        tool_call("remember_this", {"text": f"My bike is a blue Bianchi {tag}."}),
        tool_call("forget_memory", {"fragment_id": f"nope-{tag}"}),
        AIMessage("fine, carrying on"),
    ]


def _tool_replies(out: dict[str, Any]) -> dict[str, str]:
    return {str(m.name): str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)}


def _assert_the_turn_went_on(out: dict[str, Any], forget: str) -> None:
    """Every memory tool answered the model (a remember may still land: not "lost"; a forget
    is `forget`: not confirmed when no worker accepted it, under way when the workflow accepted
    it and waits for a store), and the model's last answer ended the turn."""
    replies = _tool_replies(out)
    assert replies == {
        "recall_memories": UNAVAILABLE,
        "remember_this": UNCONFIRMED,
        "forget_memory": forget,
    }, replies
    assert out["messages"][-1].content == "fine, carrying on"


async def _exists(client: MemoryClient, user: str) -> bool:
    try:
        await client.temporal.get_workflow_handle(client.workflow_id(user)).describe()
        return True
    except RPCError as err:
        assert err.status == RPCStatusCode.NOT_FOUND
        return False


async def test_an_update_no_worker_answers_is_unavailable_and_the_turn_goes_on(
    dev_env: WorkflowEnvironment, redis_url: str
) -> None:
    """No worker polls the client's queue: every update waits `update_timeout_s` (1 s here).
    Before: temporalio's WorkflowUpdateRPCTimeoutOrCancelledError from every update, and the
    recall_memories tool call failed the agent's turn."""
    client = MemoryClient(
        temporal=dev_env.client,
        task_queue=f"nobody-polls-{uuid.uuid4().hex[:8]}",
        redis=redis_url,
        update_timeout_s=1.0,
        query_timeout_s=0.5,
        close_timeout_s=2.0,
    )
    user = f"unanswered-{uuid.uuid4().hex[:8]}"
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "remember": lambda: client.remember(user, "My bike is a blue Bianchi."),
        "recall": lambda: client.recall(user, "bike"),
        "forget_fragment": lambda: client.forget_fragment(user, "x-1"),
        "consolidate": lambda: client.consolidate(user, "t"),
        "update_config": lambda: client.update_config(user, params={"top_k": 5}),
        "retry_round": lambda: client.retry_round(user, "t:0-1"),
    }
    outcomes: dict[str, str] = {}
    try:
        for name, call in calls.items():
            t0 = time.monotonic()
            try:
                await call()
                outcomes[name] = "returned"
            except MemoryUnavailableError:
                outcomes[name] = "unavailable"
            except Exception as err:  # the defect: anything else reaches the caller
                outcomes[name] = f"{type(err).__module__}.{type(err).__name__}"
            assert time.monotonic() - t0 < 1.0 + 9.0, (name, outcomes)  # a hang, not a speed
        harn = harness(client, tools=memory_tools(client), model=ScriptedModel(script=[]))
        harn.model.script.extend(_tool_turn_script("nw"))
        t0 = time.monotonic()
        out = await harn.turn(user, "t1", "what bike do I have?")
        took = time.monotonic() - t0
    finally:
        try:
            await dev_env.client.get_workflow_handle(client.workflow_id(user)).terminate("test")
        except RPCError:
            pass
        await client.aclose()
    assert outcomes == {name: "unavailable" for name in calls}, outcomes
    _assert_the_turn_went_on(out, FORGET_UNCONFIRMED.format(id="nope-nw"))
    # Each tool is bounded by the (1 s) update timeout, not the 60 s default: a bound with room
    # for a loaded machine (it shows a hang, not a speed).
    assert took < 30, took


async def test_milvus_down_under_a_real_worker_the_tools_answer_within_tool_timeout(
    dev_env: WorkflowEnvironment, redis_url: str, tmp_path: Path
) -> None:
    """A real worker whose Milvus is down: the updates' store activities keep retrying, so the
    workflow cannot answer. With the default 60 s update timeout, the tools wait only
    `tool_timeout_s` (1.5 s here) and tell the model memory is unavailable; the client's own
    calls raise MemoryUnavailableError (before: the raw temporalio error, after 60 s)."""
    port = free_port()
    milvus = await asyncio.to_thread(start_milvus_lite, port, tmp_path / "milvus")
    try:
        async with memory_worker(
            dev_env.client,
            milvus_uri=f"http://{LOOPBACK}:{port}",
            redis_url=redis_url,
            models=HeuristicMemoryModels(),
        ) as mw:
            async with mw.memory_client(redis_url, tool_timeout_s=1.5) as client:
                assert client.update_timeout_s == 60.0
                user = f"milvus-down-{uuid.uuid4().hex[:8]}"
                mw.track(client.workflow_id(user))
                kept = await client.remember(user, "My bike is a red Colnago.")
                assert kept.fragment_id
                await asyncio.to_thread(milvus.stop)
                t0 = time.monotonic()
                with pytest.raises(MemoryUnavailableError, match="did not answer"):
                    await client.recall(user, "bike", timeout_s=1.5)
                assert time.monotonic() - t0 < 1.5 + 1.0
                # An update accepted at once waits for its result: the bound covers both.
                for call in (
                    lambda: client.remember(user, "My bike has red tyres.", timeout_s=1.5),
                    lambda: client.forget_fragment(user, "nope-1", timeout_s=1.5),
                    lambda: client.forget_fragment(user, kept.fragment_id, timeout_s=1.5),
                ):
                    t0 = time.monotonic()
                    with pytest.raises(MemoryUnavailableError, match="did not answer"):
                        await call()
                    assert time.monotonic() - t0 < 1.5 + 1.0
                harn = harness(client, tools=memory_tools(client), model=ScriptedModel())
                harn.model.script.extend(_tool_turn_script("md"))
                t0 = time.monotonic()
                out = await harn.turn(user, "t1", "what bike do I have?")
                took = time.monotonic() - t0
    finally:
        await asyncio.to_thread(milvus.stop)
    _assert_the_turn_went_on(out, FORGET_PENDING.format(id="nope-md"))
    assert took < 30, took  # three tools of 1.5 s each, not 3 x 60 s (room for a loaded machine)


async def test_remember_takes_only_a_list_of_known_fragment_types(
    live_memory: LiveMemory,
) -> None:
    """Before: types="preference" was split into letters and stored as ["fact"], unknown types
    and [] silently became ["fact"]. Now a str, an unknown type or [] is refused, naming the
    allowed types, before any workflow starts; a list of known types is stored as given."""
    client = live_memory.client
    user = live_memory.new_user("types")
    for types in ("preference", ["bogus"], ["fact", "Fact"], [], [1], None):
        with pytest.raises(InvalidInputError, match=r"fragment types|types is empty") as err:
            await client.remember(user, f"My umbrella is teal {uuid.uuid4().hex[:6]}", types=types)  # type: ignore[arg-type]
        if types != []:
            assert all(t in str(err.value) for t in FRAGMENT_TYPES), str(err.value)
    assert not await _exists(client, user)
    stored: dict[str, list[str]] = {}
    for types in (["preference"], ["identity", "decision"], ("episode",)):
        result = await client.remember(user, f"My umbrella is teal {types[0]}", types=types)
        rows = await live_memory.worker.store.get(user, [result.fragment_id])
        stored[result.fragment_id] = rows[0].types
        assert rows[0].types == list(types), (types, rows[0].types)
    assert len(stored) == 3


async def test_bad_arguments_are_refused_before_any_workflow_starts(
    live_memory: LiveMemory,
) -> None:
    """Before: remember(user, None | 42) raised AttributeError; forget(reason=<600 chars> |
    None) started the user's workflow before pydantic refused the request; status(timeout_s=-1)
    reported MemoryUnavailableError(TimeoutError) and 0 meant "no workflow"."""
    client = live_memory.client
    cases: dict[str, tuple[Callable[[str], Awaitable[Any]], str]] = {
        "remember None": (lambda u: client.remember(u, None), "must be a str"),  # type: ignore[arg-type]
        "remember 42": (lambda u: client.remember(u, 42), "must be a str"),  # type: ignore[arg-type]
        "remember empty theme": (lambda u: client.remember(u, "I like tea", theme=""), "theme"),
        "forget reason 600": (lambda u: client.forget(u, reason="r" * 600), "reason"),
        "forget reason None": (lambda u: client.forget(u, reason=None), "reason"),  # type: ignore[arg-type]
        "recall empty": (lambda u: client.recall(u, "  "), "non-empty query"),
        "recall top_k 0": (lambda u: client.recall(u, "tea", top_k=0), "top_k"),
        "forget_fragment empty": (lambda u: client.forget_fragment(u, ""), "fragment_id"),
        "retry_round empty": (lambda u: client.retry_round(u, ""), "event_id"),
        "update_config list": (
            lambda u: client.update_config(u, params=[("top_k", 5)]),  # type: ignore[arg-type]
            "mapping",
        ),
        "status -1": (lambda u: client.status(u, timeout_s=-1), "timeout_s"),
        "status 0": (lambda u: client.status(u, timeout_s=0), "timeout_s"),
        "profile -1": (lambda u: client.profile(u, timeout_s=-1), "timeout_s"),
        "settle nan": (lambda u: client.settle(u, timeout_s=float("nan")), "timeout_s"),
        "recall timeout 0": (lambda u: client.recall(u, "tea", timeout_s=0), "timeout_s"),
        "remember timeout -2": (lambda u: client.remember(u, "tea", timeout_s=-2), "timeout_s"),
        "forget_fragment timeout inf": (
            lambda u: client.forget_fragment(u, "x", timeout_s=float("inf")),
            "timeout_s",
        ),
        "flush -1": (lambda u: client.flush(-1), "timeout_s"),
    }
    wrong: list[tuple[str, str]] = []
    for name, (call, names) in cases.items():
        user = live_memory.new_user("args")
        try:
            out = await asyncio.wait_for(call(user), 10)
            wrong.append((name, f"returned {out!r:.80}"))
        except InvalidInputError as err:
            if names not in str(err):
                wrong.append((name, f"message does not name {names!r}: {err}"))
        except Exception as err:
            wrong.append((name, f"{type(err).__module__}.{type(err).__name__}: {err!s:.100}"))
        if await _exists(client, user):
            wrong.append((name, "started the user's workflow"))
    assert not wrong, wrong
    with pytest.raises(InvalidInputError, match="tool_timeout_s"):
        live_memory.worker.memory_client(None, tool_timeout_s=0)


async def test_retry_round_of_an_unknown_event_id_is_a_value_error(
    live_memory: LiveMemory,
) -> None:
    """The docstring promises ValueError when there is no such round; before, temporalio's
    WorkflowUpdateFailedError reached the caller."""
    client = live_memory.client
    user = live_memory.new_user("retry")
    lines = ["My kite is orange.", "Nice."]
    await client.submit(user, conversation("t", lines, time.time() - 3600))
    await client.consolidate(user, "t")
    status = await client.settle(user, 60)
    assert status is not None and status.rounds_completed == 1
    with pytest.raises(ValueError, match="no recent round"):
        await client.retry_round(user, "no-such:1-2")
    done = status.rounds[-1].event_id
    with pytest.raises(ValueError, match="did not fail"):
        await client.retry_round(user, done)
    with pytest.raises(ValueError, match="no memory workflow"):
        await client.retry_round(live_memory.new_user("retry-none"), "t:0-1")
