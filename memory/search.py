"""Question-aware retrieval over all of a user's fragments: lexical + dense, fused, ranked, packed.

The hot path asks this on every model call with the latest human message (README.md,
"How memory is chosen for a call"). Pure and deterministic; no I/O, no model:

- lexical: Okapi BM25 over `memory.text.token_list` tokens (stemmed words, CJK character
  unigrams and bigrams, since CJK has no spaces);
- dense: cosine of the query vector with the fragment vectors the worker computed when it
  indexed them (absent vectors leave the search lexical only);
- fusion: reciprocal rank fusion of the two rankings, which needs no score calibration between
  BM25's unbounded scores and cosines;
- ranking: the memory formula, with R from the fused relevance (`memory.selection.select`, so
  the type floor and the theme cap hold as in a round's selection). Freshness is measured from
  when the fragment was said, never from its last reinforcement, so reinforced fragments cannot
  lock themselves in; reinforcement counts only through the bounded importance term;
- packing: the ranked fragments that fit an explicit token budget next to the profile.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mnemoflow.memory.prompt import filter_in_window, render_profile
from mnemoflow.memory.rerank import rerank_for_query
from mnemoflow.memory.selection import select
from mnemoflow.memory.text import BUDGET_CHARS_PER_TOKEN, estimate_tokens, normalise, token_list
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment, InjectedContext
from mnemoflow.models.fragments import Candidate, Fragment
from mnemoflow.models.params import TunedParams

#: RRF's constant: dampens the gap between rank 1 and rank 2 (the value of Cormack et al.).
RRF_K = 60
#: How deep each ranking is read before fusion; the rest cannot reach a 1,200-token budget.
DEPTH = 48
#: The dense ranking's weight in the fusion, relative to the lexical one's 1.0.
DENSE_WEIGHT = 0.15
#: Content-token Jaccard similarity from which two fragments say the same thing.
NEAR_DUPLICATE = 0.8
#: A fragment's cost beyond its content: number, theme/type/date tag, line break.
LINE_OVERHEAD_TOKENS = 12


class BM25:
    """Okapi BM25 over pre-tokenised documents (k1 = 1.2, b = 0.75)."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.lengths = [len(d) for d in docs]
        self.avg = (sum(self.lengths) / len(docs)) if docs else 0.0
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, doc in enumerate(docs):
            for term, tf in Counter(doc).items():
                self.postings.setdefault(term, []).append((i, tf))
        n = len(docs)
        self.idf = {
            t: math.log(1.0 + (n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()
        }

    def scores(self, query: Sequence[str]) -> list[float]:
        """One score per document (0 where no query term occurs)."""
        out = [0.0] * len(self.lengths)
        if not self.avg:
            return out
        for term in set(query):
            for i, tf in self.postings.get(term, ()):
                norm = self.k1 * (1.0 - self.b + self.b * self.lengths[i] / self.avg)
                out[i] += self.idf[term] * tf * (self.k1 + 1.0) / (tf + norm)
        return out


def rrf(
    rankings: Sequence[Sequence[int]], k: int = RRF_K, weights: Sequence[float] | None = None
) -> dict[int, float]:
    """Reciprocal rank fusion: sum over rankings of weight / (k + rank), rank counted from 1."""
    fused: dict[int, float] = {}
    for n, ranking in enumerate(rankings):
        weight = 1.0 if weights is None else weights[n]
        for rank, doc in enumerate(ranking, start=1):
            fused[doc] = fused.get(doc, 0.0) + weight / (k + rank)
    return fused


def _top(scores: Sequence[float], depth: int) -> list[int]:
    """Indexes of the best positive scores, best first (ties by index, for determinism)."""
    hits = [i for i, s in enumerate(scores) if s > 0.0]
    return sorted(hits, key=lambda i: (-scores[i], i))[:depth]


@dataclass(frozen=True)
class SearchDoc:
    """A searchable fragment: what is injected, plus when it was said and how often used."""

    fragment: ContextFragment
    created_at: float
    strengthen_count: int = 0


class SearchIndex:
    """The lexical index and vector matrix of one user's fragments, built once per corpus."""

    def __init__(self, docs: Sequence[SearchDoc], vectors: np.ndarray | None = None) -> None:
        if vectors is not None and len(vectors) != len(docs):
            raise ValueError(f"{len(vectors)} vectors for {len(docs)} documents")
        self.docs = list(docs)
        self.bm25 = BM25(
            [token_list(normalise(f"{d.fragment.theme} {d.fragment.content}")) for d in docs]
        )
        self.vectors = vectors

    def fused(self, query: str, query_vector: Sequence[float] | None) -> dict[int, float]:
        """RRF of the BM25 and the cosine rankings (cosine only when both vectors exist)."""
        rankings = [_top(self.bm25.scores(token_list(normalise(query))), DEPTH)]
        if query_vector is not None and self.vectors is not None and len(self.docs):
            q = np.asarray(query_vector, dtype=np.float32)
            cos = self.vectors @ (q / max(float(np.linalg.norm(q)), 1e-12))
            rankings.append(_top([float(c) + 1.0 for c in cos], DEPTH))  # shifted: all > 0
        return rrf(rankings, weights=[1.0, DENSE_WEIGHT][: len(rankings)])

    def search(
        self,
        query: str,
        query_vector: Sequence[float] | None,
        config: MemoryConfig,
        now: float,
    ) -> list[ContextFragment]:
        """The fused candidates ranked by the memory formula (floor and cap as in selection)."""
        fused = self.fused(query, query_vector)
        if not fused:
            return []
        candidates = []
        for i, relevance in fused.items():
            doc = self.docs[i]
            f = doc.fragment
            frag = Fragment(
                id=f.id,
                user_id="",
                theme=f.theme,
                types=list(f.types),
                content=f.content,
                created_at=doc.created_at,
                reinforced_at=doc.created_at,  # freshness from when it was said, not used
                strengthen_count=doc.strengthen_count,
                thread_id=f.thread_id,
                start_pos=f.start_pos,
                end_pos=f.end_pos,
            )
            candidates.append(Candidate(fragment=frag, cos=relevance))
        alpha, beta, gamma = config.search_weights
        params = TunedParams(alpha=alpha, beta=beta, gamma=gamma, delta=0.0)
        wide = config.model_copy(update={"published_candidates": 64})
        return select(candidates, params, wide, now).ranked


def budget_tokens(text: str) -> int:
    """What text costs in the memory budget (the one estimate, at the budget's ratio)."""
    return estimate_tokens(text, BUDGET_CHARS_PER_TOKEN)


def fragment_cost(fragment: ContextFragment, count: Callable[[str], int] = budget_tokens) -> int:
    """Tokens one fragment takes in the memory section."""
    return count(fragment.content) + count(fragment.theme) + LINE_OVERHEAD_TOKENS


def pack(
    fragments: Sequence[ContextFragment],
    budget: int,
    used: int = 0,
    count: Callable[[str], int] = budget_tokens,
) -> list[ContextFragment]:
    """The fragments, in order, that fit `budget` tokens after `used` (the profile's share).

    One that does not fit is skipped and smaller later ones may still go in: a long fragment
    must not leave the rest of the budget empty. A near-duplicate of one already packed (the
    same content tokens, up to NEAR_DUPLICATE Jaccard similarity, e.g. a fact repeated when it
    was recalled) is skipped too: the first one in rank order stands for both.
    """
    out: list[ContextFragment] = []
    seen: list[set[str]] = []
    for fragment in fragments:
        cost = fragment_cost(fragment, count)
        if used + cost > budget:
            continue
        tokens = set(token_list(normalise(fragment.content)))
        if any(_jaccard(tokens, other) >= NEAR_DUPLICATE for other in seen):
            continue
        out.append(fragment)
        seen.append(tokens)
        used += cost
    return out


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def choose_fragments(
    found: Sequence[ContextFragment] | None,
    context: InjectedContext | None,
    thread: str,
    window_from: float | None,
    query: str,
    config: MemoryConfig,
) -> list[ContextFragment]:
    """What a model call injects. With the search's ranking (`found`): the fragments out of the
    window, packed with the profile into `config.memory_budget_tokens`. Without it (timeout,
    failure, nothing stored yet): the published context, out of the window, re-ranked for the
    query, up to its top_k, as before the search existed."""
    if found:
        profile = context.profile if context is not None else None
        share = budget_tokens(render_profile(profile)) if profile is not None else 0
        outside = filter_in_window(found, thread, window_from)
        return pack(outside, config.memory_budget_tokens, share)
    if context is None:
        return []
    outside = filter_in_window(context.fragments, thread, window_from)
    return rerank_for_query(outside, query)[: context.top_k or config.top_k]
