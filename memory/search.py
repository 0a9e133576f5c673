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
- packing: the excerpts that fit an explicit token budget next to the profile, counted as the
  prompt renders them (headings, numbering, tags, dates, indentation; `memory.prompt`), so the
  memory section never exceeds the budget by the budget's own estimate. Fragments whose messages
  are still in the model's window are left out before the budget is filled, not after.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from mnemoflow.memory.prompt import (
    CONTINUATION,
    FRAGMENTS_HEADING,
    SECTION_BREAK,
    budget_tokens,
    filter_in_window,
    fit_profile,
    fragment_tag,
    in_window,
    memory_tokens,
    profile_section,
    profile_share,
    render_fragment,
    render_line,
)
from mnemoflow.memory.rerank import rerank_for_query
from mnemoflow.memory.selection import select
from mnemoflow.memory.text import (
    BUDGET_CHARS_PER_TOKEN,
    NEGATIONS,
    QUESTION_TOKENS,
    normalise,
    token_list,
    token_units,
)
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment, InjectedContext
from mnemoflow.models.fragments import Candidate, Fragment, LineNote
from mnemoflow.models.params import TunedParams
from mnemoflow.models.profile import UserProfile

__all__ = [
    "BM25",
    "CandidateIndex",
    "Excerpts",
    "SearchDoc",
    "SearchIndex",
    "budget_tokens",
    "choose_fragments",
    "fragment_cost",
    "near_duplicate",
    "noted_lines",
    "pack",
    "rrf",
    "split_lines",
]

#: RRF's constant: dampens the gap between rank 1 and rank 2 (the value of Cormack et al.).
RRF_K = 60
#: How deep each ranking is read before fusion; the rest cannot reach a 1,200-token budget.
DEPTH = 48
#: The dense ranking's weight in the fusion, relative to the lexical one's 1.0.
DENSE_WEIGHT = 0.15
#: Content-token Jaccard similarity from which two fragments say the same thing (unless they
#: differ in a number or a negation: then one updates the other, `near_duplicate`).
NEAR_DUPLICATE = 0.8
#: Share of the memory budget left unused (fragments still in the window or over the profile's
#: room dropped) from which the excerpts are chosen again for what is left (a second pass, ~2 ms
#: on a LoCoMo user). LoCoMo replica: 0.721 at 0, 0.718 at 0.02 and 0.05 (whole fragments lost).
REFILL_SLACK = 0.0
#: Negations of scripts without spaces (a character each), next to `memory.text.NEGATIONS`.
CJK_NEGATIONS = frozenset("不没沒无無未别別非")
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
#: Multi-hop without a model (issue 30; measured by `benchmarks/_locomo_offline.py --set`,
#: docs/MEMORY_QUALITY.md): a second lexical query made of what the notes of the best
#: `SECOND_QUERY_LINES` lines name (names, keywords and their general terms; no dates or
#: numbers), its line ranking fused at `SECOND_QUERY_WEIGHT`. 0: off.
SECOND_QUERY_LINES = 0
SECOND_QUERY_WEIGHT = 0.5
#: Candidates grouped by entity: among the first `ENTITY_GROUPS` lines of the ranking, a line
#: whose notes name nothing the lines before it did not already name goes after the others, so
#: the budget spreads over the things a set question asks about. 0: off.
ENTITY_GROUPS = 0
#: Spread over conversations: among the first `THREAD_SPREAD` lines of the ranking, a line of a
#: thread that already has `THREAD_SPREAD_CAP` lines before it goes after the others. 0: off.
THREAD_SPREAD = 0
THREAD_SPREAD_CAP = 2
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


def _top(scores: Sequence[float], depth: int, said: Sequence[float]) -> list[int]:
    """Indexes of the best positive scores, best first; ties go to the newer (`said`, an update
    of a fact outranks the fact it updates), then by index, for determinism."""
    hits = [i for i, s in enumerate(scores) if s > 0.0]
    return sorted(hits, key=lambda i: (-scores[i], -said[i], i))[:depth]


#: Tenths of a character per token of the budget's estimate (`memory.text.estimate_tokens`).
_TENTHS = round(BUDGET_CHARS_PER_TOKEN * 10)


def _units(text: str) -> int:
    """The budget's estimate before rounding (`memory.text.token_units`): units add up over
    concatenation, `budget_tokens(a + b) == _tokens(_units(a) + _units(b))`."""
    return token_units(text, BUDGET_CHARS_PER_TOKEN)


def _tokens(units: int) -> int:
    return -(-units // _TENTHS)


#: The memories section's heading (paid for by the first fragment), and what goes before each
#: item of the list.
_HEADING_UNITS = _units(SECTION_BREAK + FRAGMENTS_HEADING)
_ITEM_BREAK_UNITS = _units("\n")


@dataclass(frozen=True)
class SearchDoc:
    """A searchable fragment: what is injected, plus when it was said, how often used, and
    per line what it is indexed with (`notes`, one per `split_lines(content)`; none for a
    fragment stored before them or rewritten since: then each line is its words alone)."""

    fragment: ContextFragment
    created_at: float
    strengthen_count: int = 0
    notes: Sequence[LineNote] = ()


def noted_lines(content: str, notes: Sequence[LineNote]) -> tuple[list[str], list[str]]:
    """A fragment's lines as they are shown (each with its resolved dates, `LineNote.when`,
    in brackets after it) and as they are indexed (shown text and `LineNote.terms`). Notes
    that do not match the lines one for one are ignored."""
    lines = split_lines(content)
    if len(notes) != len(lines):
        return lines, list(lines)
    shown = [f"{line} [{n.when}]" if n.when else line for line, n in zip(lines, notes, strict=True)]
    indexed = [f"{s} {n.terms}" if n.terms else s for s, n in zip(shown, notes, strict=True)]
    return shown, indexed


class SearchIndex:
    """The lexical index and vector matrix of one user's fragments, built once per corpus."""

    def __init__(
        self, docs: Sequence[SearchDoc], vectors: np.ndarray | None = None, version: int = 0
    ) -> None:
        """`vectors`: one unit vector per fragment (None: the search is lexical only).
        `version`: the version of the corpus the docs were read at (carried by `excerpts`)."""
        if vectors is not None and len(vectors) != len(docs):
            raise ValueError(f"{len(vectors)} vectors for {len(docs)} documents")
        self.version = version
        self.docs = list(docs)
        noted = [noted_lines(d.fragment.content, d.notes) for d in self.docs]
        # what each line is indexed by: its shown text and its notes' terms (LineNote.terms)
        self._indexed = [indexed for _, indexed in noted]
        self.vectors = vectors
        # the lines as injected: verbatim, with the dates their relative expressions name
        self.lines = [shown for shown, _ in noted]
        self.line_refs = [(d, n) for d, lines in enumerate(self.lines) for n in range(len(lines))]
        self._position = {d.fragment.id: i for i, d in enumerate(self.docs)}
        self._said = [d.created_at for d in self.docs]
        self._line_said = [self._said[d] for d, _ in self.line_refs]
        # what each piece costs as the prompt renders it (`memory.prompt.render_fragment`)
        self._line_units = [_units(render_line(self.lines[d][n])) for d, n in self.line_refs]
        self._tag_units = [_ITEM_BREAK_UNITS + _units(fragment_tag(d.fragment)) for d in self.docs]
        self._gap_units = _units(render_line(GAP))
        self._continuation_units = _units(CONTINUATION)
        self._chain()

    @cached_property
    def _line_tokens(self) -> list[list[list[str]]]:
        """Each line's tokens, tokenised once for both indexes (built when first asked)."""
        return [[token_list(normalise(text)) for text in indexed] for indexed in self._indexed]

    @cached_property
    def bm25(self) -> BM25:
        """BM25 over the fragments: a fragment's terms are its theme's and its lines' (the same
        tokens as its whole text: lines never share a word across their break); built when
        first asked."""
        return BM25(
            [
                [*token_list(normalise(d.fragment.theme)), *(t for line in lines for t in line)]
                for d, lines in zip(self.docs, self._line_tokens, strict=True)
            ]
        )

    @cached_property
    def line_bm25(self) -> BM25:
        """BM25 over the lines; built when first asked (a `CandidateIndex` never does: the
        store scored its lines)."""
        return BM25([self._line_tokens[d][n] for d, n in self.line_refs])

    def _terms(self, query: str) -> list[str]:
        terms = token_list(normalise(query))
        if DROP_QUESTION_WORDS:
            terms = [t for t in terms if t not in QUESTION_TOKENS] or terms
        return terms

    def fused(self, query: str, query_vector: Sequence[float] | None) -> dict[int, float]:
        """RRF of the BM25 and the cosine rankings (cosine only when both vectors exist)."""
        rankings = [_top(self.bm25.scores(self._terms(query)), DEPTH, self._said)]
        if query_vector is not None and self.vectors is not None and len(self.docs):
            q = np.asarray(query_vector, dtype=np.float32)
            cos = self.vectors @ (q / max(float(np.linalg.norm(q)), 1e-12))
            shifted = [float(c) + 1.0 for c in cos]  # all > 0
            rankings.append(_top(shifted, DEPTH, self._said))
        return rrf(rankings, weights=[1.0, DENSE_WEIGHT][: len(rankings)])

    def search(
        self,
        query: str,
        query_vector: Sequence[float] | None,
        config: MemoryConfig,
        now: float,
        exclude: Callable[[ContextFragment], bool] | None = None,
    ) -> list[ContextFragment]:
        """The fused candidates ranked by the memory formula (floor and cap as in selection),
        without those `exclude` names."""
        fused = self.fused(query, query_vector)
        if exclude is not None:
            fused = {i: r for i, r in fused.items() if not exclude(self.docs[i].fragment)}
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
        *,
        profile: UserProfile | None = None,
        exclude: Callable[[ContextFragment], bool] | None = None,
    ) -> Excerpts:
        """The fragments' best lines for `query`, each with its neighbours, as fragments whose
        content is that excerpt (lines verbatim, in their order, GAP where lines were left out),
        most relevant first, filling `budget` tokens (default: the memory budget) with
        `profile` (cut to its share, `memory.prompt.fit_profile`), counted as the prompt renders
        them. Fragments `exclude` names (still in the model's window) are left out before the
        budget is filled. The result can be asked again (`Excerpts.again`) once the caller knows
        the profile and the window."""
        limit = config.memory_budget_tokens if budget is None else budget
        used = 0
        if profile is not None:
            used = _units(profile_section(fit_profile(profile, profile_share(limit))))
        room = limit * _TENTHS - used - _HEADING_UNITS
        skip = (
            {d for d, doc in enumerate(self.docs) if exclude(doc.fragment)}
            if exclude is not None
            else set()
        )
        chosen: dict[int, set[int]] = {}
        body: dict[int, int] = {}  # what each chosen fragment's content costs so far
        spent = 0
        ranked = self.search(query, query_vector, config, now, exclude)
        for ref in self.line_ranking(query, ranked):
            if self.line_refs[ref][0] in skip:
                continue
            new = []
            for r in self._window(ref):
                doc, n = self.line_refs[r]
                if doc not in skip and n not in chosen.get(doc, ()):
                    new.append(r)
            if not new:
                continue
            # the least the lines can add (one may close a gap): most candidates stop here
            if spent + sum(self._line_units[r] - self._gap_units for r in new) > room:
                continue
            # the matching line's fragment first, then a neighbour fragment the window reached
            new.sort(key=lambda r: r != ref)
            grown: dict[int, set[int]] = {}
            for r in new:
                doc, n = self.line_refs[r]
                grown.setdefault(doc, set(chosen.get(doc, ()))).add(n)
            cost = 0
            number = len(chosen)
            sizes = {}
            for doc, keep in grown.items():
                sizes[doc] = self._body_units(doc, keep)
                cost += sizes[doc] - body.get(doc, 0)
                if doc not in chosen:
                    number += 1
                    cost += self._tag_units[doc] + (len(str(number)) + 2) * 10  # "N. "
            if spent + cost > room:
                continue
            chosen.update(grown)
            body.update(sizes)
            spent += cost
        out = []
        for doc, keep in chosen.items():  # in the order each fragment was first chosen
            fragment = self.docs[doc].fragment
            out.append(fragment.model_copy(update={"content": _excerpt(self.lines[doc], keep)}))

        def again(**changes: Any) -> Excerpts:
            return self.excerpts(
                query,
                query_vector,
                config,
                now,
                changes.get("budget", budget),
                profile=changes.get("profile", profile),
                exclude=changes.get("exclude", exclude),
            )

        return Excerpts(out, again, self.version)

    def line_ranking(self, query: str, ranked: Sequence[ContextFragment]) -> list[int]:
        """The lines (`line_refs` positions) in the order `excerpts` takes them: BM25 over
        lines fused (RRF) with their fragment's place in `ranked` (`search`: the memory
        formula); lines neither ranking reached are left out."""
        prior = {self._position[f.id]: rank for rank, f in enumerate(ranked, start=1)}
        fused: dict[int, float] = {}
        line_scores = self.line_scores(query)
        for rank, ref in enumerate(_top(line_scores, LINE_DEPTH, self._line_said), 1):
            fused[ref] = 1.0 / (RRF_K + rank)
        for ref, (doc, _) in enumerate(self.line_refs):
            if doc in prior:
                fused[ref] = fused.get(ref, 0.0) + FRAGMENT_PRIOR / (RRF_K + prior[doc])

        def by_score() -> list[int]:
            return sorted(fused, key=lambda ref: (-fused[ref], -self._line_said[ref], ref))

        order = by_score()
        if SECOND_QUERY_LINES > 0:
            asked = set(self._terms(query))
            terms = [
                t
                for ref in order[:SECOND_QUERY_LINES]
                for t in self._entities(ref)
                if t not in asked
            ]
            second = self.expansion_scores(terms) if terms else None
            if second is not None:
                top = _top(second, LINE_DEPTH, self._line_said)
                for rank, ref in enumerate(top, 1):
                    fused[ref] = fused.get(ref, 0.0) + SECOND_QUERY_WEIGHT / (RRF_K + rank)
                order = by_score()
        if ENTITY_GROUPS > 0:
            seen: set[str] = set()
            first: list[int] = []
            later: list[int] = []
            for ref in order[:ENTITY_GROUPS]:
                named = set(self._entities(ref))
                (first if not named or named - seen else later).append(ref)
                seen |= named
            order = [*first, *later, *order[ENTITY_GROUPS:]]
        if THREAD_SPREAD > 0:
            per_thread: dict[str, int] = {}
            ahead: list[int] = []
            behind: list[int] = []
            for ref in order[:THREAD_SPREAD]:
                thread = self.docs[self.line_refs[ref][0]].fragment.thread_id
                count = per_thread.get(thread, 0)
                (ahead if count < THREAD_SPREAD_CAP else behind).append(ref)
                per_thread[thread] = count + 1
            order = [*ahead, *behind, *order[THREAD_SPREAD:]]
        return order

    def _entities(self, ref: int) -> list[str]:
        """The tokens of what a line's notes name (`LineNote.terms` items without digits:
        names, keywords and their general terms, not dates or numbers)."""
        doc, n = self.line_refs[ref]
        notes = self.docs[doc].notes
        if len(notes) != len(self.lines[doc]):
            return []
        items = [i for i in notes[n].terms.split(" | ") if i and not any(c.isdigit() for c in i)]
        return token_list(normalise(" ".join(items)))

    def expansion_scores(self, terms: list[str]) -> list[float] | None:
        """Each line's lexical score for an expansion query (None: this index cannot say)."""
        return self.line_bm25.scores(terms)

    def line_scores(self, query: str) -> list[float]:
        """Each line's lexical score for `query` (`line_refs` order; 0: no match)."""
        return self.line_bm25.scores(self._terms(query))

    def _body_units(self, doc: int, keep: set[int]) -> int:
        """What an excerpt of `keep` lines of `doc` costs as its item's content."""
        units = 0
        entries = 0
        previous = -1
        for k in sorted(keep):
            if entries and k != previous + 1:
                units += self._gap_units
                entries += 1
            units += self._line_units[self._first_ref[doc] + k]
            entries += 1
            previous = k
        return units + (entries - 1) * self._continuation_units

    def _window(self, ref: int, width: int | None = None) -> list[int]:
        """The line and `width` (default LINE_WINDOW) lines either side, in conversation order:
        across into the fragment said just before or after it in the same thread."""
        width = LINE_WINDOW if width is None else width
        before: list[int] = []
        after: list[int] = []
        r: int | None = ref
        for _ in range(width):
            r = self._prev[r] if r is not None else None
            if r is not None:
                before.insert(0, r)
        r = ref
        for _ in range(width):
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
        self._first_ref = first
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


class CandidateIndex(SearchIndex):
    """A `SearchIndex` over the candidates a store's hybrid search found, ranked by what it
    found rather than by an index of the user's whole corpus (README.md, "How memory is chosen
    for a call"): `relevance` per fragment id (the fused relevance the memory formula takes as
    R) and `line_scores` per (fragment id, line position) (the line ranking's lexical side).
    `docs` also holds the fragments next to the candidates in their threads, for the windows;
    those rank only through their lines' scores and their neighbours' windows."""

    def __init__(
        self,
        docs: Sequence[SearchDoc],
        relevance: dict[str, float],
        line_scores: dict[tuple[str, int], float],
        version: int = 0,
    ) -> None:
        super().__init__(docs, None, version)
        self._relevance = {
            self._position[fid]: r
            for fid, r in relevance.items()
            if fid in self._position and r > 0.0
        }
        self._given = [
            line_scores.get((self.docs[d].fragment.id, n), 0.0) for d, n in self.line_refs
        ]

    def fused(self, query: str, query_vector: Sequence[float] | None) -> dict[int, float]:
        """The store's fused relevance of each candidate fragment."""
        return dict(self._relevance)

    def expansion_scores(self, terms: list[str]) -> list[float] | None:
        """None: the store scored only the first query's lines."""
        return None

    def line_scores(self, query: str) -> list[float]:
        """The store's score of each line (0 for lines it did not return)."""
        return list(self._given)


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


class Excerpts(list[ContextFragment]):
    """What `SearchIndex.excerpts` found, and how to ask it again: `again(profile=...,
    exclude=..., budget=...)` fills the budget anew once the caller knows the profile and which
    fragments are still in the model's window (then those do not take the budget's room).
    `version`: the corpus version the search read (a caller that sees the corpus move since,
    after a forget in any process, searches again)."""

    def __init__(
        self,
        fragments: Sequence[ContextFragment],
        again: Callable[..., Excerpts] | None = None,
        version: int = 0,
    ) -> None:
        super().__init__(fragments)
        self.again = again
        self.version = version


def fragment_cost(fragment: ContextFragment, number: int = 1) -> int:
    """Tokens one fragment takes in the memories section as item `number`: its rendered item
    (number, tag, date, indented content) and the line break before it."""
    item = render_fragment(fragment, number)
    return _tokens(_ITEM_BREAK_UNITS + _units(item)) if item else 0


def pack(
    fragments: Sequence[ContextFragment],
    budget: int,
    used: int = 0,
    *,
    profile: UserProfile | None = None,
    limit: int | None = None,
) -> list[ContextFragment]:
    """The fragments, in order, whose memory section fits `budget` tokens after `used` and the
    `profile` (as given: cut it first with `memory.prompt.fit_profile`), counted as the prompt
    renders them (`memory.prompt.memory_tokens`), at most `limit` of them.

    One that does not fit is skipped and smaller later ones may still go in: a long fragment
    must not leave the rest of the budget empty. Of two near-duplicates (`near_duplicate`, e.g.
    a fact repeated when it was recalled) only one is kept, the newer: it takes the older one's
    place in the list (or the older one goes if the newer does not fit there).
    """
    room = (budget - used) * _TENTHS
    if profile is not None:
        room -= _units(profile_section(profile))
    out: list[ContextFragment] = []
    seen: list[tuple[set[str], frozenset[str]]] = []

    def item(fragment: ContextFragment, number: int) -> int:
        return _ITEM_BREAK_UNITS + _units(render_fragment(fragment, number))

    spent = _HEADING_UNITS  # paid for by the first item
    for fragment in fragments:
        if limit is not None and len(out) >= limit:
            break
        if not fragment.content.strip():
            continue
        marks = _marks(fragment.content)
        twin = next((n for n, other in enumerate(seen) if near_duplicate(marks, other)), None)
        if twin is not None:
            if fragment.created_at <= out[twin].created_at:
                continue  # the one already packed is as new: it stands for both
            change = item(fragment, twin + 1) - item(out[twin], twin + 1)
            if spent + change <= room:
                out[twin], seen[twin] = fragment, marks
                spent += change
            else:  # the newer does not fit where the older was: the stale one goes anyway
                del out[twin], seen[twin]
                spent = _HEADING_UNITS + sum(item(f, n) for n, f in enumerate(out, start=1))
            continue
        cost = item(fragment, len(out) + 1)
        if spent + cost > room:
            continue
        out.append(fragment)
        seen.append(marks)
        spent += cost
    return out


#: What makes a fact change: a number (any word with a digit) or a negation.
_CHANGE = re.compile(
    r"[^\W\d_]*\d[^\W_]*"
    rf"|\b(?:{'|'.join(sorted(NEGATIONS))})\b|n['\u2019]t\b"
    rf"|[{''.join(sorted(CJK_NEGATIONS))}]"
)


def _marks(content: str) -> tuple[set[str], frozenset[str]]:
    """A fragment's content tokens, and what makes a fact change: its numbers (any word with a
    digit) and its negations ("not", "never", "n't", 不 ...)."""
    found = _CHANGE.findall(content.casefold())
    facts = frozenset("not" if m in ("n't", "n\u2019t") else m for m in found)
    return set(token_list(normalise(content))), facts


def near_duplicate(a: tuple[set[str], frozenset[str]], b: tuple[set[str], frozenset[str]]) -> bool:
    """Whether two fragments (`_marks`) say the same thing: at least NEAR_DUPLICATE Jaccard
    similarity of their content tokens, and the same numbers and negations (texts that differ
    in "12" against "14", or in a "not", are an update, never a repeat)."""
    return a[1] == b[1] and _jaccard(a[0], b[0]) >= NEAR_DUPLICATE


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
    """What a model call injects, packed with the profile (cut to its share) into
    `config.memory_budget_tokens` as the prompt renders them (`memory.prompt.fit_memory`).

    With the search's ranking (`found`): the fragments out of the window. When the window (or
    the profile) left more than REFILL_SLACK of the budget unused, the search fills it again
    without the fragments still in the window (`Excerpts.again`), so those never take the room
    of older memory. When
    that leaves nothing, or without a ranking (timeout, failure, nothing stored yet): the
    published context, out of the window, re-ranked for the query, up to its top_k, within the
    same budget (a fragment too long for it is skipped)."""
    budget = config.memory_budget_tokens
    full = context.profile if context is not None else UserProfile()
    profile = fit_profile(full, profile_share(budget))
    if found:
        outside = filter_in_window(found, thread, window_from)
        chosen = pack(outside, budget, profile=profile)
        again = getattr(found, "again", None)
        unused = budget - memory_tokens(profile, chosen)
        dropped = len(outside) < len(found) or len(chosen) < len(outside)
        if again is not None and dropped and unused > REFILL_SLACK * budget:

            def still_visible(fragment: ContextFragment) -> bool:
                return in_window(fragment, thread, window_from)

            refilled = filter_in_window(
                again(profile=full, exclude=still_visible), thread, window_from
            )
            chosen = pack(refilled, budget, profile=profile)
        if chosen:
            return chosen
    if context is None:
        return []
    outside = filter_in_window(context.fragments, thread, window_from)
    ranked = rerank_for_query(outside, query)
    return pack(ranked, budget, profile=profile, limit=context.top_k or config.top_k)
