"""`mnemoflow demo`: the scripted customer-service story through `create_agent` and the middleware.

Uses a running `mnemoflow dev` stack when one is up on the data dir (its Temporal UI then stays
up after the demo), else starts the same embedded stack for the run. Session 1 states eight
low-salience details among filler; the agent is then asked for each in the same thread and in a
new thread. Messages are stamped on a virtual clock (35 s per turn, starting hours ago) so the
production gate values apply unchanged. Each session ends with `consolidate` (slice what is left
now) and `settle` (wait until it is indexed, published and inducted), the public calls a script
uses. Offline models by default, DeepSeek when its key is set.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from mnemoflow.devstack.demo_story import PROBES, SESSION_ONE, USER_ID, Probe
from mnemoflow.devstack.embedded import DevPorts, embedded_stack
from mnemoflow.devstack.stack import StackInfo, read_stack
from mnemoflow.middleware import DurableMemoryMiddleware, MemoryClient
from mnemoflow.models.config import BudgetPattern, MemoryConfig
from mnemoflow.worker.memory_client import memory_client
from mnemoflow.worker.settings import Settings

CORE_PROMPT = "You are the support agent of a small online shop. Be brief and friendly."
TURN_SECONDS = 35.0
START_HOURS_AGO = 3.0
SETTLE_DEADLINE_S = 180.0


@dataclass
class DemoContext:
    """Runtime context of the demo agent: who the customer is."""

    user_id: str


class VirtualClock:
    """Scripted time: each turn is TURN_SECONDS after the previous one, starting hours ago."""

    def __init__(self) -> None:
        self.t = time.time() - START_HOURS_AGO * 3600

    def now(self) -> float:
        """The current virtual time (unix seconds)."""
        return self.t

    def tick(self) -> float:
        """Advance one turn."""
        self.t += TURN_SECONDS
        return self.t


def demo_config() -> MemoryConfig:
    """Production gates of the customer-service preset; a 12-message window budget."""
    return MemoryConfig.from_vocation(
        "customer service", pattern=BudgetPattern.MESSAGES, trigger_threshold=12
    )


def chat_model(settings: Settings, clock: VirtualClock) -> Any:
    """DeepSeek when configured, else the offline model that answers only from its request."""
    if settings.resolved_models() == "deepseek":
        from mnemoflow.activities.llm.deepseek import deepseek_chat_model

        ds = settings.deepseek
        assert ds.api_key is not None
        return deepseek_chat_model(
            api_key=ds.api_key.get_secret_value(), base_url=ds.base_url, model=ds.model
        )
    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.devstack.demo_model import RecallOnlyChatModel

    return RecallOnlyChatModel(
        embeddings=UniversalSentenceEncoderEmbeddings(), core_prompt=CORE_PROMPT, clock=clock.now
    )


async def _turn(agent: Any, clock: VirtualClock, user: str, thread: str, text: str) -> str:
    message = HumanMessage(content=text, additional_kwargs={"time": clock.tick()})
    result = await agent.ainvoke(
        {"messages": [message]},
        config={"configurable": {"thread_id": thread}},
        context=DemoContext(user_id=user),
    )
    return str(result["messages"][-1].text)


async def _probe(
    agent: Any, model: Any, clock: VirtualClock, user: str, thread: str, label: str
) -> list[dict[str, Any]]:
    results = []
    for probe in PROBES:
        answer = await _turn(agent, clock, user, thread, probe.question)
        ok = probe.expected.lower() in answer.lower()
        # Whether memory delivered the detail at all, whatever the chat model made of it
        # (only the offline model keeps the system prompt it got).
        prompt = getattr(model, "last_system_prompt", None)
        delivered = None if prompt is None else probe.expected.lower() in prompt.lower()
        print(f"  [{label}] {probe.question} -> {answer} {'OK' if ok else 'MISSED'}", flush=True)
        results.append(_probe_row(probe, answer, ok, delivered))
    return results


def _probe_row(probe: Probe, answer: str, ok: bool, delivered: bool | None) -> dict[str, Any]:
    return {
        "detail": probe.detail,
        "question": probe.question,
        "answer": answer,
        "ok": ok,
        "in_injected_context": delivered,
    }


def _count(rows: list[dict[str, Any]], key: str) -> str:
    if any(r[key] is None for r in rows):
        return "n/a"
    return f"{sum(bool(r[key]) for r in rows)}/{len(rows)}"


async def play(client: MemoryClient, settings: Settings, info: StackInfo | None) -> dict[str, Any]:
    """Run the story against a connected MemoryClient; return the summary."""
    from mnemoflow.activities.llm.deepseek import close_chat_model

    clock = VirtualClock()
    model = chat_model(settings, clock)
    try:
        return await _story(client, settings, info, clock, model)
    finally:
        await close_chat_model(model)


async def _story(
    client: MemoryClient,
    settings: Settings,
    info: StackInfo | None,
    clock: VirtualClock,
    model: Any,
) -> dict[str, Any]:
    memory = DurableMemoryMiddleware(client=client, core_prompt=CORE_PROMPT, clock=clock.now)
    agent = create_agent(
        model,
        tools=[],
        middleware=[memory],
        checkpointer=InMemorySaver(),
        context_schema=DemoContext,
    )
    user = f"{USER_ID}-{uuid.uuid4().hex[:6]}"
    session_a, session_b = "session-1", "session-2"
    print(f"user {user}: session 1, {len(SESSION_ONE)} turns", flush=True)
    for i, line in enumerate(SESSION_ONE, 1):
        await _turn(agent, clock, user, session_a, line)
        print(f"  turn {i:2d}/{len(SESSION_ONE)}: {line}", flush=True)
    await memory.flush()  # the last hand-over is in Temporal: the turn never waited for it
    # Session 1 is over: its last messages are sliced now, not when they mature.
    ended = await client.consolidate(user, session_a)
    print(
        f"session 1 ended: consolidate made its {ended.pending_turns} pending messages due; "
        "waiting for the workers to slice, index and induct them ...",
        flush=True,
    )
    await client.settle(user, SETTLE_DEADLINE_S, inducted=True)
    print("recall within session 1:", flush=True)
    within = await _probe(agent, model, clock, user, session_a, "same thread")
    print("recall in a new session (new thread):", flush=True)
    across = await _probe(agent, model, clock, user, session_b, "new thread")
    await memory.flush()
    await client.consolidate(user, session_b)
    status = await client.settle(user, SETTLE_DEADLINE_S, inducted=True)
    if status is None:
        raise RuntimeError(f"user {user} has no memory workflow after handing turns over")
    profile = await client.profile(user)
    workflow_id = client.workflow_id(user)
    ui = info.ui_url if info else None
    return {
        "user_id": user,
        "models": settings.resolved_models(),
        "rounds": {"completed": status.rounds_completed, "failed": status.rounds_failed},
        "fragments_stored": sum(r.fragments for r in status.rounds),
        "inductions": status.inductions,
        "profile": profile.model_dump(exclude_defaults=True) if profile else {},
        "context_injected_on_last_turn": getattr(model, "last_system_prompt", ""),
        "recall_within_session": _count(within, "ok"),
        "recall_across_sessions": _count(across, "ok"),
        "details_in_injected_context_within_session": _count(within, "in_injected_context"),
        "details_in_injected_context_across_sessions": _count(across, "in_injected_context"),
        "probes": {"within_session": within, "across_sessions": across},
        "ledger": status.ledger.model_dump(),
        # Calls the chat model made; the ledger's `chat` counts those its hand-overs carried.
        "chat_model_calls": getattr(model, "calls", None),
        "temporal_ui": (
            f"{ui}/namespaces/{settings.temporal.namespace}/workflows/{quote(workflow_id, safe='')}"
            if ui
            else None
        ),
        "workflow_id": workflow_id,
    }


def print_summary(summary: dict[str, Any]) -> None:
    """The human-readable end of the demo."""
    ledger = summary["ledger"]
    chat = ledger["chat"]
    source = "estimated offline" if summary["models"] == "heuristic" else "reported by the model"
    lines = [
        "",
        "== mnemoflow demo summary ==",
        f"memory models       : {summary['models']}",
        f"rounds              : {summary['rounds']['completed']} completed, "
        f"{summary['rounds']['failed']} failed; inductions {summary['inductions']}",
        f"fragments stored    : {summary['fragments_stored']}",
        f"profile             : {json.dumps(summary['profile'], ensure_ascii=False)}",
        f"recall same session : {summary['recall_within_session']}",
        f"recall new session  : {summary['recall_across_sessions']}",
        "details injected    : "
        f"{summary['details_in_injected_context_within_session']} same session, "
        f"{summary['details_in_injected_context_across_sessions']} new session "
        "(present in the system prompt the chat model got)",
        "LLM ledger          : "
        + ", ".join(
            f"{op} {u['calls']} calls {u['input_tokens']} in / {u['output_tokens']} out"
            for op, u in ledger["by_operation"].items()
        )
        + f"; cost {ledger['cost']:.6f} {ledger['currency']}",
        f"chat model tokens   : {chat['calls']} calls {chat['input_tokens']} in / "
        f"{chat['output_tokens']} out ({source}; from the user's ledger)",
        f"Temporal UI         : {summary['temporal_ui'] or '(headless)'}",
        "context injected on the last turn:",
        summary["context_injected_on_last_turn"],
    ]
    print("\n".join(lines), flush=True)


async def run_demo(settings: Settings, out: Path, ports: DevPorts | None = None) -> int:
    """Find or start the stack, play the story, print and write the summary."""

    running = read_stack(settings.mnemoflow.data_dir)
    if running is not None:
        print(f"using the running dev stack (pid {running.pid})", flush=True)
        from mnemoflow.worker.client import connect

        stack_settings = running.apply(settings)
        summary = await _play_on(await connect(stack_settings.temporal), stack_settings, running)
    else:
        demo_dir = settings.mnemoflow.data_dir / "demo"
        demo_settings = settings.model_copy(
            update={"mnemoflow": settings.mnemoflow.model_copy(update={"data_dir": demo_dir})}
        )
        async with embedded_stack(demo_settings, ports or DevPorts()) as up:
            assert up is not None
            info, stack_settings, client = up
            summary = await _play_on(client, stack_settings, info)
    print_summary(summary)
    await asyncio.to_thread(write_summary, summary, out)
    print(f"summary written to {out}", flush=True)
    return 0


def write_summary(summary: dict[str, Any], out: Path) -> None:
    """The same summary as JSON."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")


async def _play_on(temporal: Any, settings: Settings, info: StackInfo | None) -> dict[str, Any]:
    client = memory_client(temporal, settings, demo_config())
    try:
        return await play(client, settings, info)
    finally:
        await client.aclose()
