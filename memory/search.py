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
- excerpts: what is injected is the fragments' best lines, each with its neighbours. Every line
  (a turn, verbatim with its speaker) is scored by BM25 over lines, fused (RRF) with its
  fragment's rank from the formula; in that order each line opens a window of LINE_WINDOW
  lines either side within its fragment, and windows fill the token budget. A question's
  evidence is usually one turn and the turn next to it; whole fragments spend most of the
  budget on turns the question is not about (LoCoMo evidence recall: docs/MEMORY_QUALITY.md);
- packing: the excerpts that fit an explicit token budget next to the profile.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from mnemoflow.memory.prompt import filter_in_window, render_profile
from mnemoflow.memory.rerank import rerank_for_query
from mnemoflow.memory.selection import select
from mnemoflow.memory.text import (
    BUDGET_CHARS_PER_TOKEN,
    QUESTION_TOKENS,
    estimate_tokens,
    normalise,
    token_list,
)
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
#: Okapi BM25's term-frequency saturation and length normalisation.
BM25_K1 = 1.2
BM25_B = 0.75
#: Query words that only make a question a question ("what", "did", "when") are left out of the
#: lexical query: they match every turn that asks something, not the turn that answers.
DROP_QUESTION_WORDS = True
#: Lines either side of a matching line that are injected with it (the turns before an answer are
#: often its question, the turns after it often the detail).
LINE_WINDOW = 2
#: How deep the line ranking is read.
LINE_DEPTH = 256
#: Weight of a line's fragment rank (the memory formula's) against its own lexical rank.
FRAGMENT_PRIOR = 1.0
#: Shown between lines of one fragment that were not next to each other.
GAP = "…"
_SPEAKER_LINE = re.compile(r"^(?:User|Assistant)(?: \([^)\n]*\))?:")


class BM25:
    """Okapi BM25 over pre-tokenised documents (k1 = 1.2, b = 0.75)."""

    def __init__(
        self, docs: Sequence[Sequence[str]], k1: float | None = None, b: float | None = None
    ) -> None:
        self.k1 = BM25_K1 if k1 is None else k1
        self.b = BM25_B if b is None else b
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
        """`vectors`: one unit vector per fragment (None: the search is lexical only)."""
        if vectors is not None and len(vectors) != len(docs):
            raise ValueError(f"{len(vectors)} vectors for {len(docs)} documents")
        self.docs = list(docs)
        self.bm25 = BM25(
            [token_list(normalise(f"{d.fragment.theme} {d.fragment.content}")) for d in docs]
        )
        self.vectors = vectors
        self.lines = [split_lines(d.fragment.content) for d in self.docs]
        self.line_refs = [(d, n) for d, lines in enumerate(self.lines) for n in range(len(lines))]
        self.line_bm25 = BM25([token_list(normalise(self.lines[d][n])) for d, n in self.line_refs])
        self._position = {d.fragment.id: i for i, d in enumerate(self.docs)}
        self._line_cost = [budget_tokens(self.lines[d][n]) for d, n in self.line_refs]
        self._doc_cost = [budget_tokens(d.fragment.theme) + LINE_OVERHEAD_TOKENS for d in self.docs]
        self._chain()

    def _terms(self, query: str) -> list[str]:
        terms = token_list(normalise(query))
        if DROP_QUESTION_WORDS:
            terms = [t for t in terms if t not in QUESTION_TOKENS] or terms
        return terms

    def fused(self, query: str, query_vector: Sequence[float] | None) -> dict[int, float]:
        """RRF of the BM25 and the cosine rankings (cosine only when both vectors exist)."""
        rankings = [_top(self.bm25.scores(self._terms(query)), DEPTH)]
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

    def excerpts(
        self,
        query: str,
        query_vector: Sequence[float] | None,
        config: MemoryConfig,
        now: float,
        budget: int | None = None,
    ) -> list[ContextFragment]:
        """The fragments' best lines for `query`, each with its neighbours, as fragments whose
        content is that excerpt (lines verbatim, in their order, GAP where lines were left out),
        most relevant first, filling `budget` tokens (default: the memory budget)."""
        limit = config.memory_budget_tokens if budget is None else budget
        ranked = self.search(query, query_vector, config, now)
        prior = {self._position[f.id]: rank for rank, f in enumerate(ranked, start=1)}
        fused: dict[int, float] = {}
        for rank, ref in enumerate(_top(self.line_bm25.scores(self._terms(query)), LINE_DEPTH), 1):
            fused[ref] = 1.0 / (RRF_K + rank)
        for ref, (doc, _) in enumerate(self.line_refs):
            if doc in prior:
                fused[ref] = fused.get(ref, 0.0) + FRAGMENT_PRIOR / (RRF_K + prior[doc])
        chosen: dict[int, set[int]] = {}
        used = 0
        for ref in sorted(fused, key=lambda ref: (-fused[ref], ref)):
            new = [
                r
                for r in self._window(ref)
                if self.line_refs[r][1] not in chosen.get(self.line_refs[r][0], set())
            ]
            if not new:
                continue
            cost = sum(self._line_cost[r] for r in new)
            opened = {self.line_refs[r][0] for r in new} - set(chosen)
            cost += sum(self._doc_cost[d] for d in opened)
            if used + cost > limit:
                continue
            # the matching line's fragment first, then a neighbour fragment the window reached
            for r in sorted(new, key=lambda r: r != ref):
                doc, n = self.line_refs[r]
                chosen.setdefault(doc, set()).add(n)
            used += cost
        out = []
        for doc, keep in chosen.items():  # in the order each fragment was first chosen
            fragment = self.docs[doc].fragment
            out.append(fragment.model_copy(update={"content": _excerpt(self.lines[doc], keep)}))
        return out

    def _window(self, ref: int) -> list[int]:
        """The line and LINE_WINDOW lines either side, in conversation order: across into the
        fragment said just before or after it in the same thread."""
        before: list[int] = []
        after: list[int] = []
        r: int | None = ref
        for _ in range(LINE_WINDOW):
            r = self._prev[r] if r is not None else None
            if r is not None:
                before.insert(0, r)
        r = ref
        for _ in range(LINE_WINDOW):
            r = self._next[r] if r is not None else None
            if r is not None:
                after.append(r)
        return [*before, ref, *after]

    def _chain(self) -> None:
        """Each line's neighbours: the lines next to it in its fragment, and at a fragment's
        edge the edge line of the fragment whose messages come right before (after) it."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for ref, (doc, _) in enumerate(self.line_refs):
            first.setdefault(doc, ref)
            last[doc] = ref
        self._prev: list[int | None] = [None] * len(self.line_refs)
        self._next: list[int | None] = [None] * len(self.line_refs)
        for ref, (doc, n) in enumerate(self.line_refs):
            if n > 0:
                self._prev[ref] = ref - 1
            if n + 1 < len(self.lines[doc]):
                self._next[ref] = ref + 1
        starts = {}
        for doc, d in enumerate(self.docs):
            f = d.fragment
            if f.thread_id and f.end_pos > f.start_pos and doc in first:
                starts[(f.thread_id, f.start_pos)] = doc
        for doc, d in enumerate(self.docs):
            f = d.fragment
            following = starts.get((f.thread_id, f.end_pos)) if f.thread_id else None
            if following is not None and following != doc and doc in last:
                self._next[last[doc]] = first[following]
                self._prev[first[following]] = last[doc]


def split_lines(content: str) -> list[str]:
    """A fragment's lines: one per speaker turn (`User (...): ...`, `Assistant: ...`), a line
    without a speaker joining the turn before it."""
    lines: list[str] = []
    for line in content.splitlines():
        if not line.strip():
            continue
        if lines and not _SPEAKER_LINE.match(line) and _SPEAKER_LINE.match(lines[0]):
            lines[-1] = f"{lines[-1]}\n{line}"
        else:
            lines.append(line)
    return lines


def _excerpt(lines: Sequence[str], keep: set[int]) -> str:
    out: list[str] = []
    previous = -1
    for k in sorted(keep):
        if out and k != previous + 1:
            out.append(GAP)
        out.append(lines[k])
        previous = k
    return "\n".join(out)


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
