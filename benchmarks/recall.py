"""Recall and cost: detail retention and cross-session recall, mnemoflow vs the ancestor.

The demo's story (devstack.demo_story): session 1 states eight low-salience details early among
24 turns of filler; then each detail is asked for in the same thread and in a new thread.
Both sides get the same reader (devstack.demo_model.RecallOnlyChatModel: answers only from its
request, with the default USE embeddings), the same 35 s/turn virtual clock starting hours ago,
the same 12-message window budget, the same embeddings for their vector stores, and memory
models that decide alike (mnemoflow's heuristic models; the ancestor's split/profile fakes wrap
the same heuristics, see _ancestor.py). The ancestor's stored profile is put into
state['user_profile'] before each turn, as its README asks of the application.

Reported per side: details answered (and, for mnemoflow, present in the injected context), LLM
calls and estimated input/output tokens of the memory work and of the chat model, per memory
round and per conversation.

    python benchmarks/recall.py [--short]   (short: 1 conversation per side; full: 3)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import stack, write_result

if TYPE_CHECKING:
    from mnemoflow.devstack.demo import VirtualClock

CORE = "You are the support agent of a small online shop. Be brief and friendly."
#: Bound on waiting for memory to catch up (the offline models take seconds).
SETTLE_S = 180.0


@dataclass
class Ctx:
    """Runtime context: who the customer is."""

    user_id: str


def _reader(clock: Any) -> Any:
    """The demo's recall-only chat model, counting its calls and estimated tokens."""
    from langchain_core.outputs import ChatResult

    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.devstack.demo_model import RecallOnlyChatModel

    class Counting(RecallOnlyChatModel):
        input_tokens: int = 0
        output_tokens: int = 0

        def _generate(self, messages: Any, *a: Any, **k: Any) -> ChatResult:
            result = super()._generate(messages, *a, **k)
            usage = result.generations[0].message.usage_metadata or {}
            self.input_tokens += usage.get("input_tokens", 0)
            self.output_tokens += usage.get("output_tokens", 0)
            return result

    return Counting(embeddings=UniversalSentenceEncoderEmbeddings(), core_prompt=CORE, clock=clock)


async def _turn(
    agent: Any, clock: VirtualClock, user: str, thread: str, text: str, **extra: Any
) -> str:
    from langchain_core.messages import HumanMessage

    message = HumanMessage(content=text, additional_kwargs={"time": clock.tick()})
    result = await agent.ainvoke(
        {"messages": [message], **extra},
        config={"configurable": {"thread_id": thread}},
        context=Ctx(user_id=user),
    )
    return str(result["messages"][-1].text)


async def _probes(ask: Any, model: Any, label: str) -> tuple[list[dict[str, Any]], int, int]:
    from mnemoflow.devstack.demo_story import PROBES

    rows = []
    for probe in PROBES:
        answer = await ask(probe.question)
        ok = probe.expected.lower() in answer.lower()
        delivered = probe.expected.lower() in model.last_system_prompt.lower()
        rows.append({"detail": probe.detail, "ok": ok, "in_system_prompt": delivered})
        print(f"  [{label}] {probe.detail:16s} {'OK' if ok else 'missed'}", flush=True)
    return rows, sum(r["ok"] for r in rows), sum(r["in_system_prompt"] for r in rows)


async def mnemoflow_run(client: Any) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    from mnemoflow.devstack.demo import VirtualClock
    from mnemoflow.devstack.demo_story import SESSION_ONE
    from mnemoflow.middleware import DurableMemoryMiddleware

    clock = VirtualClock()
    model = _reader(clock.now)
    memory = DurableMemoryMiddleware(client=client, core_prompt=CORE, clock=clock.now)
    agent = create_agent(
        model, tools=[], middleware=[memory], checkpointer=InMemorySaver(), context_schema=Ctx
    )
    user = f"recall-mf-{uuid.uuid4().hex[:6]}"
    for line in SESSION_ONE:
        await _turn(agent, clock, user, "s1", line)
    await memory.flush()
    await client.settle(user, SETTLE_S, inducted=True)

    async def same(q: str) -> str:
        return await _turn(agent, clock, user, "s1", q)

    async def new(q: str) -> str:
        return await _turn(agent, clock, user, "s2", q)

    within, w_ok, w_in = await _probes(same, model, "mnemoflow same thread")
    across, a_ok, a_in = await _probes(new, model, "mnemoflow new thread")
    await memory.flush()
    status = await client.settle(user, SETTLE_S, inducted=True)
    assert status is not None, "the run handed turns over, so the user has a workflow"
    ledger = status.ledger.model_dump()
    memory_ops = {
        op: {k: u[k] for k in ("calls", "input_tokens", "output_tokens")}
        for op, u in ledger["by_operation"].items()
    }
    return _side(w_ok, w_in, a_ok, a_in, within, across, memory_ops, status.rounds_completed, model)


async def ancestor_run(tmp: str) -> dict[str, Any]:
    from _ancestor import ancestor_middleware, profile_text
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.store.memory import InMemoryStore

    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.devstack.demo import VirtualClock
    from mnemoflow.devstack.demo_story import SESSION_ONE

    clock = VirtualClock()
    model = _reader(clock.now)
    memory, ledger = ancestor_middleware(
        latency_s=0.0,
        embeddings=UniversalSentenceEncoderEmbeddings(),
        db_path=os.path.join(tmp, f"ancestor-{uuid.uuid4().hex[:6]}.db"),
        core_prompt=CORE,
    )
    store = InMemoryStore()
    agent = create_agent(
        model,
        tools=[],
        middleware=[memory],
        checkpointer=InMemorySaver(),
        context_schema=Ctx,
        store=store,
    )
    user = f"recall-anc-{uuid.uuid4().hex[:6]}"

    async def turn(thread: str, text: str) -> str:
        item = await store.aget(("long-term", "user_profile"), user)
        profile = profile_text(item.value.get("user_profile", {})) if item else ""
        return await _turn(agent, clock, user, thread, text, user_profile=profile)

    for line in SESSION_ONE:
        await turn("s1", line)

    async def same(q: str) -> str:
        return await turn("s1", q)

    async def new(q: str) -> str:
        return await turn("s2", q)

    within, w_ok, w_in = await _probes(same, model, "ancestor same thread")
    across, a_ok, a_in = await _probes(new, model, "ancestor new thread")
    events = ledger.get("split", {}).get("calls", 0)
    return _side(w_ok, w_in, a_ok, a_in, within, across, ledger, events, model)


def _side(
    w_ok: int,
    w_in: int,
    a_ok: int,
    a_in: int,
    within: list,
    across: list,
    memory_ops: dict[str, Any],
    rounds: int,
    model: Any,
) -> dict[str, Any]:
    calls = sum(u["calls"] for u in memory_ops.values())
    tin = sum(u["input_tokens"] for u in memory_ops.values())
    tout = sum(u["output_tokens"] for u in memory_ops.values())
    return {
        "recall_same_thread": w_ok,
        "recall_new_thread": a_ok,
        "details_in_prompt_same_thread": w_in,
        "details_in_prompt_new_thread": a_in,
        "memory_rounds": rounds,
        "memory_llm": {"calls": calls, "input_tokens": tin, "output_tokens": tout},
        "memory_llm_by_operation": memory_ops,
        "memory_llm_per_round": {
            "calls": round(calls / rounds, 2) if rounds else 0,
            "input_tokens": round(tin / rounds) if rounds else 0,
            "output_tokens": round(tout / rounds) if rounds else 0,
        },
        "chat_model": {
            "calls": model.calls,
            "input_tokens": model.input_tokens,
            "output_tokens": model.output_tokens,
        },
        "probes": {"same_thread": within, "new_thread": across},
    }


def _mean(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("recall_same_thread", "recall_new_thread", "details_in_prompt_same_thread")
    out = {k: round(sum(r[k] for r in runs) / len(runs), 2) for k in keys}
    out["details_in_prompt_new_thread"] = round(
        sum(r["details_in_prompt_new_thread"] for r in runs) / len(runs), 2
    )
    for group in ("memory_llm", "chat_model", "memory_llm_per_round"):
        out[group] = {
            k: round(sum(r[group][k] for r in runs) / len(runs), 1) for k in runs[0][group]
        }
    out["memory_rounds"] = round(sum(r["memory_rounds"] for r in runs) / len(runs), 2)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from mnemoflow.devstack.demo import demo_config
    from mnemoflow.worker.memory_client import memory_client

    samples = 1 if args.short else 3
    result: dict[str, Any] = {"samples": samples, "details": 8, "turns": 24}
    with tempfile.TemporaryDirectory(prefix="mnemoflow-recall-") as tmp:
        anc = [await ancestor_run(tmp) for _ in range(samples)]
    async with stack(latency_s=0.0, tag="recall") as (_info, settings, temporal):
        client = memory_client(temporal, settings, demo_config())
        try:
            mf = [await mnemoflow_run(client) for _ in range(samples)]
        finally:
            await client.aclose()
    result["mnemoflow"] = {"mean": _mean(mf), "runs": mf}
    result["ancestor"] = {"mean": _mean(anc), "runs": anc}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="1 conversation per side")
    parser.add_argument("--dry-run", action="store_true", help="parse arguments and exit")
    args = parser.parse_args()
    if args.dry_run:
        return 0
    result = asyncio.run(run(args))
    print(
        f"{'':10s} {'same':>6s} {'new':>6s} {'rounds':>7s} {'mem calls':>10s} "
        f"{'mem in/out tok':>16s} {'chat in tok':>12s}"
    )
    for side in ("mnemoflow", "ancestor"):
        m = result[side]["mean"]
        print(
            f"{side:10s} {m['recall_same_thread']:>4}/8 {m['recall_new_thread']:>4}/8 "
            f"{m['memory_rounds']:>7} {m['memory_llm']['calls']:>10} "
            f"{m['memory_llm']['input_tokens']:>8}/{m['memory_llm']['output_tokens']:<7} "
            f"{m['chat_model']['input_tokens']:>12}"
        )
    write_result("recall", result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
