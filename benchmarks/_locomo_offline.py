"""An in-process replica of benchmarks/locomo.py's mnemoflow side, for iterating on retrieval.

No Temporal, Redis or Milvus: each 64 turns of a session are sliced by the heuristic slicer as
one round, the index step's repeat filter applies against the peers production reads (`Stored`:
the last rounds' fragments and the nearest ones, not the whole history), fragments are embedded
with USE, and each question runs the same pure search, packing and prompt rendering the
middleware runs. It leaves out what only the real run has (reinforcement, the induced profile's
exact timing; question threads handed over as memory only with `--question-threads`), so its
figures are a guide; the committed figures come from benchmarks/locomo.py.

    python benchmarks/_locomo_offline.py [--conversations N] [--questions N] [--ranks]
        [--milvus URI]

`--milvus URI` runs each question through the search served by Milvus instead
(`middleware/milvus_search.py`: the conversation's fragments stored with their lines by the
worker's `FragmentStore`, candidates from the lines' BM25 search and the fragments' vector
search, fused and ranked in process); the
in-process index is then used only for `--ranks`.

`--ranks` also prints, per category, how many evidence turns were injected and where the
search's line ranking (`SearchIndex.line_ranking`) put the ones that were not.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT
from _locomo_data import (
    CATEGORIES,
    Baselines,
    conversations,
    evidence_texts,
    judge,
    norm,
    session_turns,
)
from _locomo_report import token_counter

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo"
CACHE = Path("/tmp/locomo_offline_vectors")


class Stored:
    """A user's stored fragments as the index step's repeat filter reads them
    (`activities.fragments.only_new` over `FragmentStore.repeat_peers`): each new fragment is
    compared with the fragments of the REPEAT_ROUNDS rounds before its round and the
    REPEAT_NEIGHBOURS stored ones nearest it by vector, at most MAX_REPEAT_PEERS, not with the
    whole history. Rounds are numbered from 1, one per `add`."""

    def __init__(self, emb: Any) -> None:
        self.emb = emb
        self.fragments: list[Any] = []
        self.rounds: list[int] = []
        self.vectors: list[Any] = []
        self.round_no = 0
        self.peers_read = 0  # how many stored fragments the last `add` compared against

    def add(self, fragments: list[Any]) -> list[Any]:
        """Store what of one round's `fragments` is new; returns those."""
        from mnemoflow.activities.fragments import (
            MAX_REPEAT_PEERS,
            REPEAT_NEIGHBOURS,
            REPEAT_ROUNDS,
            new_information,
        )

        self.round_no += 1
        self.peers_read = 0
        if not fragments:
            return []
        vectors = _unit(self.emb.embed_documents([f.content for f in fragments]))
        since = self.round_no - REPEAT_ROUNDS
        picked = {i for i, r in enumerate(self.rounds) if since <= 0 or r >= since}
        if since > 0 and self.vectors and REPEAT_NEIGHBOURS > 0:
            import numpy as np

            cos = vectors @ np.vstack(self.vectors).T
            for row in cos:
                picked.update(int(i) for i in np.argsort(-row, kind="stable")[:REPEAT_NEIGHBOURS])
        oldest_first = sorted(
            picked, key=lambda i: (self.fragments[i].created_at, self.fragments[i].id)
        )
        peers = [self.fragments[i] for i in oldest_first[-MAX_REPEAT_PEERS:]]
        self.peers_read = len(peers)
        new = new_information(fragments, peers)
        kept = {f.id for f in new}
        for f, v in zip(fragments, vectors, strict=True):
            if f.id in kept:
                self.fragments.append(f)
                self.rounds.append(self.round_no)
                self.vectors.append(v)
        return new


async def fragments_of(conv: Any, user: str, emb: Any = None) -> list[Any]:
    """The fragments stored of the conversation (`stored_of`)."""
    return (await stored_of(conv, user, emb)).fragments


async def stored_of(conv: Any, user: str, emb: Any = None) -> Stored:
    """The conversation sliced one round per 64 turns of a session, what each round adds
    stored (`Stored`: the production repeat filter's bounded peers); `emb`: USE if None."""
    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.activities.llm.base import validate_drafts
    from mnemoflow.activities.llm.enrichment import with_notes
    from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
    from mnemoflow.models.contracts import RoundInput
    from mnemoflow.workflows.memory_round import build_fragments

    models = HeuristicMemoryModels()
    stored = Stored(emb or UniversalSentenceEncoderEmbeddings())
    for n in sorted(conv.sessions):
        thread = f"session-{n}"
        turns = session_turns(conv, n)
        for start in range(0, len(turns), 64):
            batch = turns[start : start + 64]
            drafts = validate_drafts((await models.slice(batch, 16)).drafts, len(batch), 16)
            drafts = with_notes(drafts, batch)  # as the slice activity does
            inp = RoundInput.model_construct(
                user_id=user,
                round_no=len(stored.fragments) + 1000 * n + start,
                thread_id=thread,
                turns=batch,
                event_id="e",
                first_seq=0,
            )
            frags = build_fragments(inp, drafts, 1e12)
            stored.add(frags)
    return stored


def _unit(rows: Any) -> Any:
    import numpy as np

    m = np.asarray(rows, dtype=np.float16).astype(np.float32)
    return m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)


def _asked(question: str, n: int, now: float, stored: Stored) -> list[Any]:
    """The fragment a question's thread becomes (question + NO_ANSWER), stored unless a
    repeat (one round of its own)."""
    from mnemoflow.models.fragments import Fragment

    frag = Fragment(
        id=f"q{n}",
        user_id="u",
        theme="general",
        types=["chat"],
        content=f"User: {question}\nAssistant: I will check my notes.",
        created_at=now,
        reinforced_at=now,
        round_no=10**6 + n,
        thread_id=f"question-{n}",
        start_pos=0,
        end_pos=2,
    )
    return stored.add([frag])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--conversations", type=int, default=0, help="the first N (0: all)")
    parser.add_argument("--questions", type=int, default=0)
    parser.add_argument("--budget", type=int, default=1200)
    parser.add_argument("--baselines", action="store_true")
    parser.add_argument("--set", action="append", default=[], help="module.NAME=python-literal")
    parser.add_argument("--weights", default="")
    parser.add_argument("--question-threads", action="store_true")
    parser.add_argument("--ranks", action="store_true", help="where missed evidence ranked")
    parser.add_argument("--milvus", default="", help="a Milvus URI: search served by Milvus")
    parser.add_argument(
        "--flush-rows", type=int, default=64, help="the store's flush_rows with --milvus"
    )
    parser.add_argument("--out", default="", help="also write benchmarks/results/<out>.json")
    parser.add_argument(
        "--simulate",
        default="",
        help="rrf:L or weighted:L: Milvus's candidate step imitated in process (to sweep)",
    )
    parser.add_argument(
        "--record",
        default="",
        help="store this run's figures as the step named here in "
        "benchmarks/results/locomo_steps.json (docs/MEMORY_QUALITY.md's table of steps)",
    )
    parser.add_argument(
        "--tried",
        default="",
        help="store this run as an experiment named here, measured and left out, in "
        "locomo_steps.json's `tried` (docs/MEMORY_QUALITY.md compares it with the last step)",
    )
    parser.add_argument(
        "--window-schedule",
        default="",
        help="neighbours by rank instead of LINE_WINDOW, e.g. 3:2,8:1,9999:0 (tried, left out)",
    )
    args = parser.parse_args()
    import ast
    import importlib

    for item in args.set:
        target, value = item.split("=", 1)
        module, name = target.rsplit(".", 1)
        setattr(importlib.import_module(f"mnemoflow.{module}"), name, ast.literal_eval(value))

    if args.window_schedule:
        _narrowing_windows(args.window_schedule)
    import numpy as np

    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.activities.llm.heuristic_profile import extract_profile
    from mnemoflow.memory.profile_merge import merge_profile
    from mnemoflow.memory.prompt import assemble_system_prompt, date_label
    from mnemoflow.memory.search import SearchDoc, SearchIndex, choose_fragments
    from mnemoflow.models.config import MemoryConfig
    from mnemoflow.models.contracts import ContextFragment, InjectedContext
    from mnemoflow.models.profile import UserProfile

    emb = UniversalSentenceEncoderEmbeddings()
    count = token_counter()
    config = MemoryConfig(memory_budget_tokens=args.budget)
    if args.weights:
        config = config.model_copy(
            update={"search_weights": tuple(float(w) for w in args.weights.split(","))}
        )
    convs = conversations(Path(args.data), args.conversations)
    totals: dict[str, list[bool]] = {}
    tokens: list[int] = []
    ranks: dict[str, Counter[str]] = {}
    started = time.perf_counter()
    for conv in convs:
        stored = asyncio.run(stored_of(conv, "u", emb))
        frags = list(stored.fragments)
        served = _served(args.milvus, emb, frags, args.flush_rows) if args.milvus else None
        vectors = _unit(emb.embed_documents([f.content for f in frags]))
        docs = [SearchDoc(ContextFragment.of(f), f.created_at, 0, tuple(f.notes)) for f in frags]
        index = SearchIndex(docs, vectors)
        profile = merge_profile(UserProfile(), extract_profile(f.content for f in frags))
        context = InjectedContext(user_id="u", version=1, generated_at=0, profile=profile)
        now = max(t.time for t in conv.turns) + 86400
        questions = conv.questions[: args.questions] if args.questions else conv.questions
        base = Baselines(conv, emb, count, date_label) if args.baselines else None
        qvecs = emb.embed_documents([q["question"] for q in questions])
        said = [norm(index.lines[d][n]) for d, n in index.line_refs]
        for n, (q, qv) in enumerate(zip(questions, qvecs, strict=True)):
            if args.question_threads and n:
                # the previous question's thread, handed over as memory like any turn
                asked = _asked(questions[n - 1]["question"], n - 1, now, stored)
                if asked:
                    frags.extend(asked)
                    vectors = np.vstack([vectors, _unit(emb.embed_documents([asked[0].content]))])
                    docs.append(SearchDoc(ContextFragment.of(asked[0]), asked[0].created_at, 0))
                    index = SearchIndex(docs, vectors)
            evidence = evidence_texts(conv, q)
            if not evidence:
                continue
            if args.simulate:
                found = _simulated(index, args.simulate, q["question"], qv).excerpts(
                    q["question"], qv, config, now
                )
            elif served is not None:
                found = served.candidates("u", q["question"], qv).excerpts(
                    q["question"], qv, config, now
                )
            else:
                found = index.excerpts(q["question"], qv, config, now)
            chosen = choose_fragments(found, context, "q", 0, q["question"], config)
            memory = assemble_system_prompt("", profile, chosen)
            tokens.append(count(memory))
            hit = judge(memory, evidence, q.get("answer", ""))["all"]
            cat = CATEGORIES[q["category"]]
            totals.setdefault(cat, []).append(hit)
            totals.setdefault(f"conv {conv.name}", []).append(hit)
            totals.setdefault("all", []).append(hit)
            if args.ranks:
                ranked = index.search(q["question"], qv, config, now)
                order = index.line_ranking(q["question"], ranked)
                tally = ranks.setdefault(cat, Counter())
                where = _where(evidence, norm(memory), said, order)
                tally.update(where)
                tally["questions missed"] += not hit
                tally["of them with a turn past 100"] += "missed 101+" in where
            if base is not None:
                b = judge(base.bm25_text(q["question"], args.budget), evidence, "")["all"]
                totals.setdefault("bm25", []).append(b)
                h = judge(base.hybrid_text(q["question"], args.budget), evidence, "")["all"]
                totals.setdefault("hybrid", []).append(h)
                totals.setdefault(f"hybrid {cat}", []).append(h)
        print(f"[{conv.name}] {len(frags)} fragments, profile {count(str(profile))} chars-ish")
    out = {k: round(sum(v) / len(v), 3) for k, v in totals.items()}
    out["median_tokens"] = sorted(tokens)[len(tokens) // 2]
    out["s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))
    if ranks:
        out["ranks"] = {cat: {k: t[k] for k in RANK_BUCKETS if t[k]} for cat, t in ranks.items()}
    if args.record or args.tried:
        _record(args, out)
    if args.out:
        from _common import write_result

        write_result(args.out, {"evidence_recall": out}, args)
    for cat, tally in sorted(ranks.items()):
        print(cat, json.dumps({k: tally[k] for k in RANK_BUCKETS if tally[k]}))
    return 0


def _record(args: Any, out: dict[str, Any]) -> None:
    """Add (or replace) this run as the step `args.record`, or the experiment `args.tried`, of
    locomo_steps.json, with where it came from (commit, arguments, machine), in the order they
    were first recorded."""
    from _common import RESULTS, meta

    path = RESULTS / "locomo_steps.json"
    steps = json.loads(path.read_text()) if path.exists() else {"steps": []}
    key, name = ("tried", args.tried) if args.tried else ("steps", args.record)
    entries = steps.setdefault(key, [])
    entry = {"step": name, "figures": out, "_meta": meta(args)}
    names = [s["step"] for s in entries]
    if name in names:
        entries[names.index(name)] = entry
    else:
        entries.append(entry)
    path.write_text(json.dumps(steps, indent=1) + "\n")


def _simulated(index: Any, how: str, question: str, qv: Any) -> Any:
    """`middleware.milvus_search.candidate_index` imitated over the in-process index: the top L
    lines by BM25 and by their fragment's cosine, fused as Milvus fuses them, their fragments
    and the fragments next to them."""
    import numpy as np

    from mnemoflow.memory.search import DENSE_WEIGHT, RRF_K, CandidateIndex

    kind, limit, *rest = how.split(":")
    depth = int(limit)
    dense_depth = int(rest[0]) if rest else depth
    agg = rest[1] if len(rest) > 1 else "max"
    neighbours = not (len(rest) > 2 and rest[2] == "nonb")
    lex = index.line_bm25.scores(index._terms(question))
    q = np.asarray(qv, dtype=np.float32)
    cos = index.vectors @ (q / np.linalg.norm(q))
    dense = [float(cos[d]) for d, _ in index.line_refs]
    lex_top = [r for r in sorted(range(len(lex)), key=lambda r: -lex[r]) if lex[r] > 0][:depth]
    dense_top = sorted(range(len(dense)), key=lambda r: -dense[r])[:dense_depth]
    fused: dict[int, float] = {}
    if kind.startswith("rrf"):
        # "rrf": both sides alike; "rrf6": the lexical side counted 6 times (6 requests)
        times = int(kind[3:] or 1)
        for ranking, w in ((lex_top, float(times)), (dense_top, 1.0)):
            for rank, r in enumerate(ranking, 1):
                fused[r] = fused.get(r, 0.0) + w / (RRF_K + rank)
    elif kind.startswith("atan"):
        # Milvus's WeightedRanker (norm_score, as Lite and the server run it): BM25 through
        # 2/pi atan, cosine through (1 + cos) / 2; "atan0.05": the dense weight
        import math

        w_dense = float(kind[4:] or DENSE_WEIGHT)
        for r in lex_top:
            fused[r] = fused.get(r, 0.0) + 2.0 * math.atan(lex[r]) / math.pi
        for r in dense_top:
            fused[r] = fused.get(r, 0.0) + w_dense * (1.0 + dense[r]) / 2.0
    else:
        for ranking, scores, w in ((lex_top, lex, 1.0), (dense_top, dense, DENSE_WEIGHT)):
            if not ranking:
                continue
            hi, lo = scores[ranking[0]], scores[ranking[-1]]
            for r in ranking:
                norm = (scores[r] - lo) / (hi - lo) if hi > lo else 1.0
                fused[r] = fused.get(r, 0.0) + w * norm
    top = sorted(fused, key=lambda r: -fused[r])[:depth]
    relevance: dict[str, float] = {}
    lines: dict[tuple[str, int], float] = {}
    wanted = set()
    for r in top:
        d, n = index.line_refs[r]
        fid = index.docs[d].fragment.id
        lines[(fid, n)] = fused[r]
        if agg == "sum":
            relevance[fid] = relevance.get(fid, 0.0) + fused[r]
        else:
            relevance[fid] = max(relevance.get(fid, 0.0), fused[r])
        wanted.add(d)
        if not neighbours:
            continue
        for edge in (
            index._first_ref[d],
            max(i for i, (x, _) in enumerate(index.line_refs) if x == d),
        ):
            for nb in (index._prev[edge], index._next[edge]):
                if nb is not None:
                    wanted.add(index.line_refs[nb][0])
    docs = [index.docs[d] for d in sorted(wanted)]
    return CandidateIndex(docs, relevance, lines)


def _served(uri: str, emb: Any, frags: list[Any], flush_rows: int = 64) -> Any:
    """A fresh fragment collection with the conversation's fragments and lines, and the
    agent's Milvus search over it."""
    import uuid

    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.middleware import milvus_search

    name = f"locomo_{uuid.uuid4().hex[:10]}"
    store = FragmentStore(uri, emb, collection=name, lines=True, flush_rows=flush_rows)

    async def fill() -> None:
        await store.ensure()
        for start in range(0, len(frags), 256):
            await store.upsert(frags[start : start + 256])
        if not flush_rows:  # everything in one segment: Lite keeps BM25 statistics per segment
            lines = store.lines_collection
            assert lines is not None
            await store._run_write(lambda c: (c.flush(name), c.flush(lines)))
        await store.close()

    asyncio.run(fill())
    # read here, so that `--set middleware.milvus_search.CANDIDATE_LINES=N` reaches the search
    lines_read = milvus_search.CANDIDATE_LINES
    return milvus_search.MilvusSearch(
        uri, collection=store.collection, embeddings=emb, candidate_lines=lines_read
    )


def _narrowing_windows(schedule: str) -> None:
    """Make each line's window as wide as `schedule` says for its place in the line ranking:
    "3:2,8:1,9999:0" is 2 neighbours either side for places 1-3, 1 to place 8, none after."""
    from mnemoflow.memory.search import SearchIndex

    steps = [tuple(int(x) for x in part.split(":")) for part in schedule.split(",")]
    ranking = SearchIndex.line_ranking
    narrow = SearchIndex._window
    places: dict[int, int] = {}

    def line_ranking(self: Any, *args: Any, **kwargs: Any) -> list[int]:
        order = ranking(self, *args, **kwargs)
        places.clear()
        places.update((ref, n) for n, ref in enumerate(order, 1))
        return order

    def window(self: Any, ref: int, width: int | None = None) -> list[int]:
        width = next((w for upto, w in steps if places.get(ref, 10**6) <= upto), 0)
        return narrow(self, ref, width)

    SearchIndex.line_ranking = line_ranking  # type: ignore[method-assign]
    SearchIndex._window = window  # type: ignore[method-assign]


#: Where an evidence turn stood: injected, or the bucket of its best line's place in the
#: search's line ranking (a line the ranking did not reach, or a turn not stored, counts as
#: 101+).
RANK_BUCKETS = (
    "injected",
    "missed 1-10",
    "missed 11-35",
    "missed 36-100",
    "missed 101+",
    "questions missed",
    "of them with a turn past 100",
)


def _where(evidence: list[str], memory: str, said: list[str], order: list[int]) -> list[str]:
    place = {ref: n for n, ref in enumerate(order, 1)}
    out = []
    for text in evidence:
        if text in memory:
            out.append("injected")
            continue
        best = min(
            (place.get(ref, 10**6) for ref, line in enumerate(said) if text in line), default=10**6
        )
        edges = ((10, "missed 1-10"), (35, "missed 11-35"), (100, "missed 36-100"))
        out.append(next((name for edge, name in edges if best <= edge), "missed 101+"))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
