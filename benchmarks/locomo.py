"""LoCoMo: does the memory a model call gets hold the evidence of the question asked?

Each conversation goes through the public API on a real embedded stack (Temporal dev server,
Redis, Milvus Lite, one worker with the offline heuristic memory models and USE embeddings):
every session is its own thread, handed over with MemoryClient.submit, each turn stamped with
the session's date and its speaker's name (speaker_a as the user, speaker_b as the assistant);
then the rounds are settled. Every category 1-4 question is then asked in a new thread through
DurableMemoryMiddleware in a LangChain agent whose chat model records its system prompt; the
memory part of that prompt is what is judged. The mnemoflow side asks read-only
(`remember=False`: the questions read memory and add nothing, so what a call gets does not
depend on how far the rounds of earlier questions got); the reinforced side hands its turns
over and reinforces what its answers drew on:

- evidence recall: every evidence turn's text appears in it (case and whitespace normalised);
  also the any-evidence variant, and whether the gold answer appears verbatim;
- injected tokens (cl100k_base), retrieval time per question (the whole agent call with an
  instant model: everything the middleware adds), ingest time and rounds per conversation;
- baselines over the raw turns at the same token budget: a hybrid (BM25 over each turn with
  its session date and speaker, fused by reciprocal rank with dense), BM25, dense (the same
  USE model) and recency; and the size of the full conversation.

    python benchmarks/locomo.py [--data DIR] [--conversations N] [--short] [--questions N]

--short: one conversation, its first 30 questions. Results: benchmarks/results/locomo.json (per
question: locomo_questions.jsonl) and
docs/MEMORY_QUALITY.md (table, plus docs/img/locomo_recall.svg).

--llm: the same benchmark with the DeepSeek memory models (slice with its enrichment, tune,
induct) instead of the offline ones, for a user with a key (DEEPSEEK_API_KEY; DEEPSEEK_BASE_URL
and DEEPSEEK_MODEL as the worker reads them). It calls the API for every round of every
conversation, so it never runs in CI. Only the mnemoflow side without reinforcement is asked
(the reinforced side would double the bill). Its report gives the memory models' tokens and
cost per conversation (the user workflow's ledger); results go to
benchmarks/results/locomo_llm.json and locomo_llm_questions.jsonl, never to the docs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, ROOT, meta, summary_ms, write_result
from _locomo_data import (
    CATEGORIES,
    Baselines,
    Conversation,
    conversations,
    evidence_texts,
    judge,
    session_turns,
)
from _locomo_report import token_counter, write_report

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"
CORE = "You are a helpful assistant with a long memory of this conversation."
SETTLE_DEADLINE_S = 1800.0
SIDES = ("mnemoflow", "mnemoflow_reinforced", "hybrid", "bm25", "dense", "recency")
NO_ANSWER = "I will check my notes."


def _recorder(answers_from_memory: bool = False) -> Any:
    """A chat model that records the system prompt it is given and answers instantly: with
    NO_ANSWER (so no injected fragment is ever drawn on, nothing is reinforced), or, with
    `answers_from_memory`, with the line of its memory section that shares most words with
    the question, as a model answering from memory would (that fragment is then reinforced,
    and the reply handed over as memory like any turn)."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    from mnemoflow.memory.text import query_overlap

    class Recorder(GenericFakeChatModel):
        last_system_prompt: str = ""
        from_memory: bool = False

        def _generate(self, messages: Any, *a: Any, **k: Any) -> Any:
            system = [m for m in messages if m.type == "system"]
            self.last_system_prompt = system[0].text if system else ""
            if not self.from_memory:
                return super()._generate(messages, *a, **k)
            question = next((m.text for m in reversed(messages) if m.type == "human"), "")
            lines = [ln.strip() for ln in _memory_part(self.last_system_prompt).splitlines()]
            lines = [ln for ln in lines if ": " in ln and not ln.startswith("#")]
            scored = [(query_overlap(question, ln), -i, ln) for i, ln in enumerate(lines)]
            best = max(scored, default=(0.0, 0, NO_ANSWER))
            reply = best[2].split(": ", 1)[1] if best[0] > 0 else NO_ANSWER
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=reply))])

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    def forever() -> Any:
        while True:
            yield AIMessage(content=NO_ANSWER)

    return Recorder(messages=forever(), from_memory=answers_from_memory)


async def _settle(client: Any, user: str, threads: list[str]) -> Any:
    """Wait (bounded) until every handed-over turn is indexed and fragments inducted."""
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    while True:
        status = await client.status(user)
        if status is not None and status.uninducted == 0 and status.pending_turns == 0:
            marks = [status.watermarks.get(t) for t in threads]
            if all(m is not None and m.indexed >= m.accepted for m in marks):
                return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"memory did not settle within {SETTLE_DEADLINE_S:.0f} s")
        await asyncio.sleep(0.5)


async def ingest(client: Any, conv: Conversation, user: str) -> dict[str, Any]:

    started = time.perf_counter()
    threads = []
    for n in sorted(conv.sessions):
        thread = f"session-{n}"
        turns = session_turns(conv, n)
        await client.submit(user, turns)
        threads.append(thread)
    status = await _settle(client, user, threads)
    ledger = status.ledger
    total = ledger.total()
    cost = {
        "calls": total.calls,
        "input_tokens": total.input_tokens,
        "output_tokens": total.output_tokens,
        "cache_hit_tokens": total.cache_hit_tokens,
        "cache_miss_tokens": total.cache_miss_tokens,
        "cost": round(ledger.cost, 6),
        "currency": ledger.currency,
        "by_operation": {
            op: {"calls": u.calls, "input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
            for op, u in sorted(ledger.by_operation.items())
        },
    }
    return {
        "memory_models": cost,
        "ingest_s": round(time.perf_counter() - started, 1),
        "sessions": len(threads),
        "turns": len(conv.turns),
        "rounds": status.rounds_completed,
        "rounds_failed": status.rounds_failed,
        "fragments": sum(r.fragments for r in status.rounds),
    }


def _memory_part(prompt: str) -> str:
    return prompt[len(CORE) :] if prompt.startswith(CORE) else prompt


async def ask_all(
    client: Any,
    conv: Conversation,
    users: dict[str, str],
    questions: list[dict[str, Any]],
    args: Any,
) -> list[dict[str, Any]]:
    """Every question, in a new thread, to each mnemoflow side (`users`: side -> user id, each
    ingested alike), and to the baselines."""
    from dataclasses import dataclass

    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.memory.prompt import date_label
    from mnemoflow.middleware import DurableMemoryMiddleware

    @dataclass
    class Ctx:
        user_id: str

    count = token_counter()
    last = max(t.time for t in conv.turns)
    clock = {"now": last + 86400.0}
    agents = {}
    for side in users:
        model = _recorder(answers_from_memory=side == "mnemoflow_reinforced")
        # The plain side probes memory read-only (LoCoMo's protocol: the memory is built from
        # the conversation, the questions only read it); the reinforced side's model draws on
        # memory, so its turns are handed over and what it drew on is reinforced.
        memory = DurableMemoryMiddleware(
            client=client,
            core_prompt=CORE,
            clock=lambda: clock["now"],
            remember=side == "mnemoflow_reinforced",
        )
        agent = create_agent(
            model, tools=[], middleware=[memory], checkpointer=InMemorySaver(), context_schema=Ctx
        )
        agents[side] = (model, memory, agent)
    base = Baselines(conv, UniversalSentenceEncoderEmbeddings(), count, date_label)
    fallbacks = _Fallbacks()
    search_log = logging.getLogger("mnemoflow.middleware.search")
    search_log.addHandler(fallbacks)
    search_log.setLevel(logging.INFO)
    # Each side asks every question before the next side starts, and the reinforced side's
    # memory work is settled before anything else runs: what the plain side's calls find
    # depends on nothing that runs beside them (the rows other users write to the same Milvus
    # segments change its BM25 statistics), so a re-run gives the same figures.
    times = [last + 86400.0 + 60.0 * (i + 1) for i in range(len(questions))]
    texts: list[dict[str, str]] = [{} for _ in questions]
    fell_back: list[dict[str, bool]] = [{} for _ in questions]
    elapsed = [0.0 for _ in questions]
    for side, (model, memory, agent) in agents.items():
        for i, q in enumerate(questions):
            clock["now"] = times[i]
            message = HumanMessage(content=q["question"], additional_kwargs={"time": times[i]})
            before = fallbacks.count
            started = time.perf_counter()
            await agent.ainvoke(
                {"messages": [message]},
                config={"configurable": {"thread_id": f"question-{i}"}},
                context=Ctx(user_id=users[side]),
            )
            if side == "mnemoflow":
                elapsed[i] = time.perf_counter() - started
            fell_back[i][side] = fallbacks.count > before
            texts[i][side] = _memory_part(model.last_system_prompt)
        if memory.remember:
            await memory.flush()
            await client.settle(users[side], timeout_s=SETTLE_DEADLINE_S)
    rows = []
    for i, q in enumerate(questions):
        evidence = evidence_texts(conv, q)
        texts[i].update(
            {
                "hybrid": base.hybrid_text(q["question"], args.budget),
                "bm25": base.bm25_text(q["question"], args.budget),
                "dense": base.dense_text(q["question"], args.budget),
                "recency": base.recency_text(args.budget),
            }
        )
        row: dict[str, Any] = {
            "q": i,
            "category": CATEGORIES[q["category"]],
            "evidence_turns": len(evidence),
            "retrieval_s": round(elapsed[i], 4),
        }
        for side, text in texts[i].items():
            row[side] = {**judge(text, evidence, q.get("answer", "")), "tokens": count(text)}
            if side in fell_back[i]:
                row[side]["fell_back"] = fell_back[i][side]
        rows.append(row)
    search_log.removeHandler(fallbacks)  # the remembering side was flushed and settled above
    for row in rows:
        row["full_context_tokens"] = base.full_context_tokens
    return rows


class _Fallbacks(logging.Handler):
    """Counts the model calls whose search missed its deadline or failed (the middleware then
    injects the published context), from the search module's log."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "missed its" in message or "search failed" in message:
            self.count += 1


def _count_reinforcements(client: Any) -> Counter[str]:
    """Count the reinforcement signals the client sends, per user (wraps client.reinforce)."""
    counts: Counter[str] = Counter()
    send = getattr(client, "_locomo_unwrapped_reinforce", None) or client.reinforce
    client._locomo_unwrapped_reinforce = send

    async def counted(user_id: str, call_id: str, fragment_ids: Any) -> None:
        counts[user_id] += 1
        await send(user_id, call_id, fragment_ids)

    client.reinforce = counted
    return counts


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    judged = [r for r in rows if r["evidence_turns"]]
    out: dict[str, Any] = {"questions": len(rows), "with_evidence": len(judged)}
    sides = [side for side in SIDES if rows and side in rows[0]]
    for side in sides:
        out[side] = {
            "evidence_recall_all": _mean([r[side]["all"] for r in judged]),
            "evidence_recall_any": _mean([r[side]["any"] for r in judged]),
            "answer_contained": _mean([r[side]["answer"] for r in rows]),
            "median_tokens": statistics.median([r[side]["tokens"] for r in rows]) if rows else 0,
        }
        if rows and "fell_back" in rows[0][side]:
            # calls whose search missed its deadline (or failed): the published context was used
            out[side]["fell_back"] = sum(r[side]["fell_back"] for r in rows)
    out["by_category"] = {
        cat: {
            "n": len(sel := [r for r in judged if r["category"] == cat]),
            **{side: _mean([r[side]["all"] for r in sel]) for side in sides},
        }
        for cat in CATEGORIES.values()
    }
    out["retrieval"] = summary_ms([r["retrieval_s"] for r in rows])
    return out


def _mean(values: list[bool]) -> float:
    return round(sum(values) / len(values), 3) if values else 0.0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from _common import stack

    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.models.config import MemoryConfig
    from mnemoflow.worker.memory_client import memory_client

    convs = conversations(Path(args.data), args.conversations)
    if not convs:
        raise SystemExit(f"no LoCoMo conversations in {args.data}")
    config = MemoryConfig(memory_budget_tokens=args.budget)
    per_conv: dict[str, Any] = {}
    all_rows: list[dict[str, Any]] = []
    models = "deepseek" if args.llm else "heuristic"
    async with stack(latency_s=0.0, tag="locomo", models=models) as (_info, settings, temporal):
        embeddings = UniversalSentenceEncoderEmbeddings()
        client = memory_client(temporal, settings, config, embeddings=embeddings)
        client.searcher.warm()
        try:
            for conv in convs:
                # The same ids every run (the stack is new each time): a row's key decides
                # where Milvus puts it and the order of equal scores.
                users = {"mnemoflow": f"locomo-{conv.name}"}
                if args.reinforcement == "both":
                    users["mnemoflow_reinforced"] = f"locomo-{conv.name}-r"
                print(f"[{conv.name}] ingesting {len(conv.turns)} turns x{len(users)}", flush=True)
                # one user after the other: the order of the rows written is the same each run
                done = [await ingest(client, conv, u) for u in users.values()]
                ingested = done[0]
                print(f"[{conv.name}] {ingested}", flush=True)
                questions = conv.questions[: args.questions] if args.questions else conv.questions
                signals = _count_reinforcements(client)
                rows = await ask_all(client, conv, users, questions, args)
                ingested["reinforce_signals"] = dict(signals)
                summary = summarise(rows)
                print(f"[{conv.name}] {_line(summary)}", flush=True)
                per_conv[conv.name] = {"ingest": ingested, "summary": summary, "rows": rows}
                all_rows.extend(rows)
        finally:
            await client.aclose()
    return {
        "models": models,
        "budget_tokens": args.budget,
        "tokenizer": token_counter().name,  # type: ignore[attr-defined]
        "overall": summarise(all_rows),
        "full_context_tokens": {
            k: v["rows"][0]["full_context_tokens"] for k, v in per_conv.items() if v["rows"]
        },
        "conversations": per_conv,
    }


def write_questions(result: dict[str, Any], name: str = "locomo") -> None:
    """Per-question rows, one JSON line each, to benchmarks/results/<name>_questions.jsonl;
    the results JSON keeps the summaries (the rows would make it 24,000 lines)."""
    lines = []
    for conv_name, conv in result["conversations"].items():
        for row in conv.pop("rows"):
            lines.append(json.dumps({"conversation": conv_name, **row}, separators=(",", ":")))
    (RESULTS / f"{name}_questions.jsonl").write_text("\n".join(lines) + "\n")


def cost_report(result: dict[str, Any]) -> str:
    """What the memory models cost, per conversation and in all (markdown), with the evidence
    recall they bought: `--llm`'s report."""
    lines = [
        f"Memory models: {result.get('models', '?')}; memory budget {result['budget_tokens']} "
        "tokens.",
        "",
        "| conversation | turns | calls | input tokens (cache hit) | output tokens | cost | "
        "evidence recall | median injected tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    totals = Counter[str]()
    currency = ""
    for name, conv in result["conversations"].items():
        ing, s = conv["ingest"], conv["summary"]["mnemoflow"]
        m = ing["memory_models"]
        currency = m["currency"]
        totals.update(
            {k: m[k] for k in ("calls", "input_tokens", "cache_hit_tokens", "output_tokens")}
        )
        totals["cost_micro"] += round(m["cost"] * 1e6)
        lines.append(
            f"| {name} | {ing['turns']} | {m['calls']} | {m['input_tokens']} "
            f"({m['cache_hit_tokens']}) | {m['output_tokens']} | {m['cost']:.4f} {currency} | "
            f"{s['evidence_recall_all']:.3f} | {s['median_tokens']:.0f} |"
        )
    overall = result["overall"]["mnemoflow"]
    lines.append(
        f"| all | | {totals['calls']} | {totals['input_tokens']} ({totals['cache_hit_tokens']}) "
        f"| {totals['output_tokens']} | {totals['cost_micro'] / 1e6:.4f} {currency} | "
        f"{overall['evidence_recall_all']:.3f} | {overall['median_tokens']:.0f} |"
    )
    return "\n".join(lines)


def _line(s: dict[str, Any]) -> str:
    return "  ".join(
        f"{side} {s[side]['evidence_recall_all']:.2f}/{s[side]['evidence_recall_any']:.2f}"
        f" ({s[side]['median_tokens']:.0f} tok)"
        for side in SIDES
        if side in s
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        default=str(DEFAULT_DATA),
        help="a folder of LoCoMo JSON files, or one file (one conversation or the published "
        "locomo10.json list)",
    )
    parser.add_argument("--conversations", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--questions", type=int, default=0, help="per conversation; 0 = all")
    parser.add_argument("--budget", type=int, default=1200, help="memory tokens (all sides)")
    parser.add_argument("--short", action="store_true", help="1 conversation, 30 questions")
    parser.add_argument(
        "--reinforcement",
        choices=("both", "off"),
        default="both",
        help="both: also a side whose answers draw on memory (so fragments are reinforced)",
    )
    parser.add_argument(
        "--llm",
        action="store_true",
        help="DeepSeek memory models (needs DEEPSEEK_API_KEY; calls the API, never in CI); "
        "reports the token cost per conversation",
    )
    parser.add_argument("--dry-run", action="store_true", help="parse arguments and exit")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the doc from the last results"
    )
    args = parser.parse_args()
    if args.report_only:
        write_report(json.loads((RESULTS / "locomo.json").read_text()))
        return 0
    if args.short:
        args.conversations, args.questions = 1, args.questions or 30
    if args.llm:
        if not os.environ.get("DEEPSEEK_API_KEY"):
            raise SystemExit("--llm needs DEEPSEEK_API_KEY (DeepSeek memory models)")
        args.reinforcement = "off"
    if args.dry_run:
        return 0
    result = asyncio.run(run(args))
    if args.llm:
        print(cost_report(result))
        write_questions(result, "locomo_llm")
        write_result("locomo_llm", result, args)
        return 0
    print("overall (all/any evidence recall, median tokens):", _line(result["overall"]))
    write_questions(result)
    write_result("locomo", result, args)
    write_report({"_meta": meta(args), **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
