"""How far ranking single turns can go at the memory budget (docs/MEMORY_QUALITY.md, "Ceiling").

The memory search injects whole turns, verbatim. A question counts only if all of its evidence
turns are injected, and about 35 LoCoMo turns fit the ~1,200-token budget. This script ranks
every stored line (what the offline slicer keeps: one turn per line, with its speaker) for every
question, with no budget logic at all, and reports the share of questions whose evidence lines
are all among the top K:

- `bm25`: the search's own line ranking (memory.search: BM25, question words dropped);
- `use`: cosine of USE line vectors with the question's (the project's embeddings);
- `minilm` (with `--minilm`): all-MiniLM-L6-v2, a retrieval-trained English encoder
  (benchmarks/_minilm.py);
- `bm25+use`, `bm25+minilm`: reciprocal rank fusion of the two (k = 60);
- `+nb`: also counted when an evidence line is next to (±1) a top-K line, as the search's
  neighbour windows would bring it, at up to three times the lines.

Beside it, the median cl100k tokens of the top K lines, so K reads as a budget.

    python benchmarks/locomo_ceiling.py [--data DIR] [--conversations N] [--minilm]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import write_result
from _locomo_data import CATEGORIES, conversations, evidence_texts, norm
from _locomo_offline import DEFAULT_DATA, _unit, fragments_of
from _locomo_report import token_counter

KS = (10, 20, 35, 50)
RRF_K = 60


def _fuse(*rankings: list[int]) -> list[int]:
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, line in enumerate(ranking, start=1):
            scores[line] = scores.get(line, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores, key=lambda line: (-scores[line], line))


def _dense(matrix: Any, query: Any) -> list[int]:
    import numpy as np

    return [int(i) for i in np.argsort(-(matrix @ query), kind="stable")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--conversations", type=int, default=0, help="0: all in --data")
    parser.add_argument("--minilm", action="store_true", help="also rank with all-MiniLM-L6-v2")
    parser.add_argument("--name", default="locomo_ceiling")
    args = parser.parse_args()

    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.memory.search import SearchDoc, SearchIndex, _top
    from mnemoflow.models.contracts import ContextFragment

    use = UniversalSentenceEncoderEmbeddings()
    minilm = None
    if args.minilm:
        from _minilm import MiniLM

        minilm = MiniLM()
    count = token_counter()
    convs = conversations(Path(args.data), args.conversations)
    hits: dict[str, dict[str, list[bool]]] = {}
    tokens: dict[int, list[int]] = {k: [] for k in KS}
    started = time.perf_counter()
    for conv in convs:
        frags = asyncio.run(fragments_of(conv, "u"))
        index = SearchIndex([SearchDoc(ContextFragment.of(f), f.created_at, 0) for f in frags])
        lines = [index.lines[d][n] for d, n in index.line_refs]
        normed = [norm(line) for line in lines]
        questions = [q for q in conv.questions if evidence_texts(conv, q)]
        asked = [q["question"] for q in questions]
        dense = {"use": (_unit(use.embed_documents(lines)), _unit(use.embed_documents(asked)))}
        if minilm is not None:
            dense["minilm"] = (minilm.embed(lines), minilm.embed(asked))
        for n, q in enumerate(questions):
            wanted = []
            for text in evidence_texts(conv, q):
                wanted.append(next((i for i, line in enumerate(normed) if text in line), None))
            lexical = _top(index.line_bm25.scores(index._terms(q["question"])), len(lines))
            rankings = {"bm25": lexical}
            for name, (matrix, queries) in dense.items():
                rankings[name] = _dense(matrix, queries[n])
                rankings[f"bm25+{name}"] = _fuse(lexical, rankings[name])
            for k in KS:
                top = rankings["bm25"][:k]
                tokens[k].append(sum(count(lines[i]) + 1 for i in top))
            cat = CATEGORIES[q["category"]]
            for name, ranking in rankings.items():
                pos = {line: r for r, line in enumerate(ranking)}
                for k in KS:
                    alone = all(w is not None and pos.get(w, len(lines)) < k for w in wanted)
                    near = all(
                        w is not None and min(pos.get(w + d, len(lines)) for d in (-1, 0, 1)) < k
                        for w in wanted
                    )
                    for key, ok in ((f"{name}@{k}", alone), (f"{name}+nb@{k}", near)):
                        hits.setdefault(key, {}).setdefault("all", []).append(ok)
                        hits[key].setdefault(cat, []).append(ok)
        print(f"[{conv.name}] {len(lines)} lines, {len(questions)} questions", flush=True)
    table = {
        key: {cat: round(sum(v) / len(v), 3) for cat, v in by.items()} for key, by in hits.items()
    }
    result = {
        "conversations": [c.name for c in convs],
        "questions": len(next(iter(hits.values()))["all"]) if hits else 0,
        "token_counter": count.name,
        "median_tokens_of_top_k_lines": {str(k): statistics.median(v) for k, v in tokens.items()},
        "recall_at_k": table,
        "seconds": round(time.perf_counter() - started, 1),
    }
    for key in sorted(table):
        print(f"{key:24s} {table[key]['all']:.3f}")
    print("median tokens of top-K lines:", result["median_tokens_of_top_k_lines"])
    write_result(args.name, result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
