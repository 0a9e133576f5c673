"""The per-call memory search served by Milvus (README.md, "How memory is chosen for a call";
docs/ARCHITECTURE.md, "Read path").

The agent process holds no user's corpus. Each search asks Milvus for candidates and ranks only
those, with the code the in-process search runs (`memory.search.CandidateIndex`): two searches,
strongly consistent and restricted to the user by the partition key. BM25 over the lines'
analysed terms (`memory.lines.query_terms`, the tokenisation of the in-process search) in the
line collection (`activities/line_rows.py`, one row per line of every fragment, carrying its
fragment's fields); the question's vector against the fragment collection, each fragment found
standing for its lines (every line of a fragment had its fragment's vector, so the line rows
carry none). The two are fused here as Milvus fuses a hybrid search (weighted, the dense side at
FUSED_DENSE_WEIGHT, each side normalised as Milvus normalises it). Each hit brings its line's
place and its fragment (content, theme, types, time, strength, thread and span), so no further
read follows: a second query of the fragment collection for ~100 candidate ids cost 8-9 ms of
the ~20 ms Milvus Lite took per call (docs/PERFORMANCE.md). One hybrid search of line rows that
carried the vector cost Milvus Lite more than these two: it materialises every column of every
hit, a 512-d vector included.

The store's collections are what the search trusts: the fragment store deletes a fragment's
lines before its row and reads the delete back until no line is left
(`activities/fragment_store.py`), and writes the lines after the row, so a forgotten fragment
leaves the candidates in the step that deletes it. A forget that lands while a search runs is
caught by the corpus version (below).

Then the memory formula, the line ranking, the windows and the packing run on those few
fragments in this process. A window crosses into the fragment said just before or after only
when that fragment is a candidate too: fetching the candidates' neighbours as well (a third
read) injected less evidence on LoCoMo (0.728 against 0.737, `benchmarks/_locomo_offline.py
--simulate`), their lines taking the room of better-ranked ones. The question is embedded
here, as for the in-process search (`middleware/search.py`). Every Milvus call has a deadline
(`timeout_s`); the model call waits for the search at most `MemoryConfig.search_deadline_s`,
then uses the published context.

The corpus version (`models.corpus.corpus_version_key`, which the worker moves on every write
and, by a larger step, on every delete) is read before Milvus is asked, so a search that a
forget in another process overtook reads as older, by a delete, than the version the model call
sees, and is run again (`models.corpus.forgotten_since`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from langchain_core.embeddings import Embeddings
from pymilvus import MilvusClient

from mnemoflow.memory.lines import LINES_SUFFIX, line_texts, query_terms
from mnemoflow.memory.search import RRF_K, CandidateIndex, SearchDoc
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.corpus import (
    CorpusEntry,
    corpus_version,
    corpus_version_key,
    encode_vector,
)
from mnemoflow.models.ids import user_key, validate_user_id
from mnemoflow.models.profile import UserProfile

#: Lines the search returns and its BM25 side reads (CANDIDATE_LINES), lines its dense side ranks
#: (DENSE_LINES), and the dense side's weight in the weighted fusion (as Milvus's `WeightedRanker`,
#: which Milvus Lite and the server normalise alike: BM25 scores through 2/pi atan, cosines as
#: (1+cos)/2; `_fused` does the same). Chosen on LoCoMo (five conversations, evidence recall at
#: ~1,190 tokens, `benchmarks/_locomo_offline.py`; `--simulate` imitates this step in process,
#: within 0.01 of Milvus Lite): RRF of both sides alike 0.65; weighted, dense at 0.15 (the
#: in-process fusion's weight, but atan compresses BM25's spread, so the dense side counts for more
#: here) 0.70-0.71; at 0.02 / 0.03 / 0.05 / 0.08 with 128 and 48 lines 0.718 / 0.722 / 0.720 /
#: 0.720; 0.05 with 128 and 96 lines 0.725; 256 BM25 lines 0.712. Later, served by Milvus Lite
#: (`--milvus`, dense at 0.05, BM25/dense lines): 128/96 0.728, 96/96 0.734, 96/64 0.732, 80/64
#: 0.730, 64/64 0.722, 64/48 0.714. Fewer lines than 96 lose evidence; more add lines that rank
#: below the budget, and Milvus time (the hybrid search at 600 lines for a user: ~12 ms at 128
#: lines, ~8 ms at 64).
CANDIDATE_LINES = 96
DENSE_LINES = 96
#: The dense side reads this many nearest fragments of the fragment collection and ranks their
#: lines, DENSE_LINES at most (the line rows carry no vector: `activities/line_rows.py`). A
#: LoCoMo fragment has ~5 lines, the hot-path benchmark's 3: 32 fragments reach 96 lines
#: with either, and the dense side only decides lines that BM25 does not rank
#: (FUSED_DENSE_WEIGHT is small).
DENSE_FRAGMENTS = 32
FUSED_DENSE_WEIGHT = 0.05
#: How Milvus fuses the two rankings: "weighted" (above) or "rrf" (reciprocal rank fusion,
#: both sides alike).
FUSION = "weighted"
DEFAULT_COLLECTION = "mnemoflow_fragments"
#: Milvus Lite's partition-key buckets (as `activities/fragment_store.py` names them): Lite
#: does not prune by a `user_key == ...` filter, so reads name the user's bucket.
LITE_BUCKETS = 16
LITE_BUCKET_PREFIX = "_pk_"
#: The fragment collection's columns a candidate needs (`activities/fragment_rows.py`).
FRAGMENT_FIELDS = [
    "pk",
    "theme",
    "types",
    "content",
    "created_at",
    "strengthen_count",
    "thread_id",
    "start_pos",
    "end_pos",
]
HIT_FIELDS = ["fragment_id", "position", "fragment"]
_HEX = re.compile(r"[0-9a-f]{1,64}")
# Fragment ids as the store admits them (`activities/fragment_rows.py`, `is_valid_id`): only
# such ids go into a filter expression.
_ID = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")
_QUERY_WINDOW = 16_384
# A theme prefix goes into a `like` expression: nothing that `like` or the quotes would read.
_THEME_PREFIX = re.compile(r"[A-Za-z0-9:.-]{1,64}")


def _hex(value: str) -> str:
    if not _HEX.fullmatch(value):
        raise ValueError("not a hex key")
    return value


def _strings(values: Sequence[str]) -> str:
    return ", ".join(json.dumps(v) for v in values)


class MilvusSearch:
    """Search one user's fragments for a question: candidates from Milvus, ranked here."""

    def __init__(
        self,
        uri: str,
        *,
        token: str | None = None,
        collection: str = DEFAULT_COLLECTION,
        embeddings: Embeddings | None = None,
        redis: aioredis.Redis | None = None,
        key_prefix: str = "mnemoflow:",
        timeout_s: float = 2.0,
        candidate_lines: int = CANDIDATE_LINES,
    ) -> None:
        self.uri = uri
        self.collection = collection
        self.lines = f"{collection}{LINES_SUFFIX}"
        self.embeddings = embeddings
        self.redis = redis
        self.prefix = key_prefix
        self.timeout_s = timeout_s
        self.candidate_lines = candidate_lines
        self._token = token or ""
        self._client: MilvusClient | None = None
        self._lock = threading.Lock()
        self._lite: bool | None = None

    def __repr__(self) -> str:  # no token in logs
        return f"MilvusSearch(uri={self.uri!r}, collection={self.collection!r})"

    def warm(self) -> None:
        """Load the embedding model now (the first encode otherwise takes ~1.5 s)."""
        if self.embeddings is not None:
            self.embeddings.embed_query("warm up")

    def drop(self, user_id: str) -> None:
        """Nothing to drop: no user's fragments are held here."""

    async def close(self) -> None:
        """Close the Milvus connection (a later search reconnects)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)

    def _connected(self) -> MilvusClient:
        with self._lock:
            if self._client is None:
                self._client = MilvusClient(uri=self.uri, token=self._token, timeout=self.timeout_s)
            return self._client

    def _opts(self, key: str) -> dict[str, Any]:
        opts: dict[str, Any] = {"timeout": self.timeout_s}
        if self._lite is None:
            version = str(self._connected().get_server_version(timeout=self.timeout_s))
            self._lite = version.startswith("milvus_lite")
        if self._lite:
            bucket = int(hashlib.md5(key.encode()).hexdigest(), 16) % LITE_BUCKETS
            opts["partition_names"] = [f"{LITE_BUCKET_PREFIX}{bucket}"]
        return opts

    async def _version(self, user_id: str) -> int:
        if self.redis is None:
            return 0
        async with asyncio.timeout(self.timeout_s):
            return corpus_version(await self.redis.get(corpus_version_key(self.prefix, user_id)))

    async def version(self, user_id: str) -> int:
        """The user's corpus version (0: none, or no Redis)."""
        return await self._version(validate_user_id(user_id))

    async def themed_entries(self, user_id: str, theme_prefix: str) -> list[CorpusEntry]:
        """The user's fragments whose theme starts with `theme_prefix` (the LangGraph store's
        items, middleware/store.py), with their vectors, read from the fragment collection
        (strongly consistent: a forgotten one is not there)."""
        if not _THEME_PREFIX.fullmatch(theme_prefix):
            raise ValueError("a theme prefix is letters, digits, ':', '.' or '-'")
        key = _hex(user_key(validate_user_id(user_id)))

        def work() -> list[CorpusEntry]:
            client, opts = self._connected(), self._opts(key)
            expr = f'{_user(key)} and theme like "{theme_prefix}%"'
            rows = client.query(
                self.collection,
                filter=expr,
                output_fields=[*FRAGMENT_FIELDS, "vector"],
                limit=_QUERY_WINDOW,
                consistency_level="Strong",
                **opts,
            )
            return [
                CorpusEntry(
                    **_context(row).model_dump(exclude={"score"}),
                    strengthen_count=int(row["strengthen_count"]),
                    vector=encode_vector([float(x) for x in row["vector"]]),
                )
                for row in rows
            ]

        return await asyncio.to_thread(work)

    async def search(
        self,
        user_id: str,
        query: str,
        config: MemoryConfig,
        now: float,
        *,
        profile: UserProfile | None = None,
        exclude: Callable[[ContextFragment], bool] | None = None,
    ) -> list[ContextFragment]:
        """Excerpts of the user's fragments for `query`, most relevant first, filling the memory
        budget (`memory.search.SearchIndex.excerpts` over the candidates; errors propagate, the
        caller falls back to the published context)."""
        uid = validate_user_id(user_id)
        # The version's Redis read runs on the loop while the thread embeds the question; the
        # thread waits for it before Milvus is asked (the order the module docstring needs).
        version_read = asyncio.run_coroutine_threadsafe(
            self._version(uid), asyncio.get_running_loop()
        )

        def work() -> list[ContextFragment]:  # one thread hop: embed, read, rank
            vector = None if self.embeddings is None else self.embeddings.embed_query(query)
            version = version_read.result(timeout=self.timeout_s + 1.0)
            index = self.candidates(uid, query, vector, version)
            return index.excerpts(query, vector, config, now, profile=profile, exclude=exclude)

        try:
            return await asyncio.to_thread(work)
        finally:
            version_read.cancel()  # when the thread never got to wait for it

    async def copies_of(self, user_id: str, fragment_id: str, min_chars: int) -> list[str]:
        """Ids of the user's other fragments that hold the named fragment's words (case and
        spacing aside; none when they are shorter than `min_chars`): found by a lexical search
        for those words, then checked word for word."""
        uid = validate_user_id(user_id)
        if not _ID.fullmatch(fragment_id):
            return []

        def work() -> list[str]:
            key = _hex(user_key(uid))
            client, opts = self._connected(), self._opts(key)
            named = _fragments(client, self.collection, key, [fragment_id], opts)
            if not named:
                return []
            words = _folded(named[0][0].content)
            if len(words) < min_chars:
                return []
            index = candidate_index(
                client,
                self.lines,
                key,
                named[0][0].content,
                None,
                opts,
                fragments=self.collection,
            )
            return [
                d.fragment.id
                for d in index.docs
                if d.fragment.id != fragment_id and words in _folded(d.fragment.content)
            ]

        return await asyncio.to_thread(work)

    def candidates(
        self, user_id: str, query: str, vector: Sequence[float] | None, version: int = 0
    ) -> CandidateIndex:
        """The candidate fragments for `query` and their neighbours, as an index (blocking)."""
        return candidate_index(
            self._connected(),
            self.lines,
            _hex(user_key(user_id)),
            query,
            vector,
            self._opts(user_key(user_id)),
            self.candidate_lines,
            version,
            fragments=self.collection,
        )


def _folded(text: str) -> str:
    return " ".join(text.casefold().split())


def _user(key: str) -> str:
    return f'user_key == "{_hex(key)}"'


def candidate_index(
    client: MilvusClient,
    lines: str,
    key: str,
    query: str,
    vector: Sequence[float] | None,
    opts: dict[str, Any],
    limit: int = CANDIDATE_LINES,
    version: int = 0,
    *,
    fragments: str | None = None,
) -> CandidateIndex:
    """The reads of the module docstring, as a `CandidateIndex` (blocking). `fragments`: the
    fragment collection (default: the one `lines` is named after)."""
    if fragments is None:
        fragments = lines.removesuffix(LINES_SUFFIX)
    hits = _hybrid(client, lines, fragments, key, query, vector, opts, limit)
    line_scores: dict[tuple[str, int], float] = {}
    relevance: dict[str, float] = {}
    found: dict[str, tuple[ContextFragment, int]] = {}
    for hit in hits:
        fid, score = hit.fragment_id, hit.score
        line_scores[(fid, hit.position)] = score
        relevance[fid] = max(relevance.get(fid, 0.0), score)
        if fid not in found:
            fields = hit.fields
            found[fid] = (_context({**fields, "pk": fid}), int(fields["strengthen_count"]))
    docs = [SearchDoc(f, f.created_at, count) for f, count in found.values()]
    docs.sort(key=lambda d: (d.created_at, d.fragment.id))
    return CandidateIndex(docs, relevance, line_scores, version)


@dataclass(frozen=True)
class LineHit:
    """One candidate line: where it stands, its fused score and its fragment's fields
    (FRAGMENT_FIELDS without the id)."""

    fragment_id: str
    position: int
    score: float
    fields: dict[str, Any]


def _bm25_norm(score: float) -> float:
    """A BM25 score as Milvus's weighted fusion normalises it (into [0, 1))."""
    return 2.0 * math.atan(score) / math.pi


def _cosine_norm(score: float) -> float:
    """A cosine as Milvus's weighted fusion normalises it (into [0, 1])."""
    return (1.0 + score) * 0.5


def _hybrid(
    client: MilvusClient,
    lines: str,
    fragments: str,
    key: str,
    query: str,
    vector: Sequence[float] | None,
    opts: dict[str, Any],
    limit: int,
) -> list[LineHit]:
    """The user's best lines for the question, with their fragments' fields, best first: the
    BM25 side from the line collection, the dense side from the fragment collection (each
    fragment found standing for its lines, in order, DENSE_LINES at most), fused here as Milvus
    fuses a hybrid search (`FUSION`: weighted, each side normalised, or reciprocal rank). Both
    reads strongly consistent: a line or fragment deleted before the call is not there."""
    expr = _user(key)
    terms = query_terms(query)
    sides: list[list[tuple[str, int, float, dict[str, Any]]]] = []
    if terms:
        found = client.search(
            lines,
            data=[terms],
            anns_field="sparse",
            search_params={"metric_type": "BM25"},
            filter=expr,
            limit=limit,
            output_fields=HIT_FIELDS,
            consistency_level="Strong",
            **opts,
        )
        bm25 = []
        for hit in found[0] if found else []:
            entity = hit.get("entity", hit)
            fid = str(entity["fragment_id"])
            if _ID.fullmatch(fid):
                fields = json.loads(entity["fragment"])
                # BM25 scores are >= 0; Milvus Lite's plain search returns them negated
                score = abs(float(hit["distance"]))
                bm25.append((fid, int(entity["position"]), score, fields))
        sides.append(bm25)
    if vector is not None:
        found = client.search(
            fragments,
            data=[list(map(float, vector))],
            anns_field="vector",
            search_params={"metric_type": "COSINE", "params": {"ef": max(64, DENSE_FRAGMENTS)}},
            filter=expr,
            limit=DENSE_FRAGMENTS,
            output_fields=FRAGMENT_FIELDS,
            consistency_level="Strong",
            **opts,
        )
        dense: list[tuple[str, int, float, dict[str, Any]]] = []
        room = min(limit, DENSE_LINES)
        for hit in found[0] if found else []:
            entity = hit.get("entity", hit)
            fid = str(entity.get("pk", hit.get("id")))
            if not _ID.fullmatch(fid):
                continue
            fields = {name: entity[name] for name in FRAGMENT_FIELDS if name != "pk"}
            cosine = float(hit["distance"])
            for n in range(len(line_texts(str(fields["content"])))):
                if len(dense) >= room:
                    break
                dense.append((fid, n, cosine, fields))
        sides.append(dense)
    if not sides:
        return []
    if len(sides) == 1:  # one side only: its own ranking, scored as RRF would score it
        return [
            LineHit(fid, pos, 1.0 / (RRF_K + n), fields)
            for n, (fid, pos, _, fields) in enumerate(sides[0][:limit], start=1)
        ]
    return _fused(sides[0], sides[1], limit)


def _fused(
    bm25: list[tuple[str, int, float, dict[str, Any]]],
    dense: list[tuple[str, int, float, dict[str, Any]]],
    limit: int,
) -> list[LineHit]:
    """Both sides' lines fused, best first, `limit` at most (a line on one side only gets
    nothing from the other)."""
    scores: dict[tuple[str, int], float] = {}
    fields_of: dict[tuple[str, int], dict[str, Any]] = {}
    for side, (weight, norm) in (
        (bm25, (1.0, _bm25_norm)),
        (dense, (FUSED_DENSE_WEIGHT, _cosine_norm)),
    ):
        for rank, (fid, pos, score, fields) in enumerate(side, start=1):
            line = (fid, pos)
            fields_of.setdefault(line, fields)
            if FUSION == "weighted":
                part = weight * norm(score)
            else:
                part = 1.0 / (RRF_K + rank)
            scores[line] = scores.get(line, 0.0) + part
    ranked = sorted(scores.items(), key=lambda kv: -kv[1])[:limit]
    return [LineHit(fid, pos, score, fields_of[(fid, pos)]) for (fid, pos), score in ranked]


def _fragments(
    client: MilvusClient, collection: str, key: str, ids: list[str], opts: dict[str, Any]
) -> list[tuple[ContextFragment, int]]:
    """The stored fragments among `ids` (strongly consistent: a deleted one is not there)."""
    if not ids:
        return []
    expr = f"{_user(key)} and pk in [{_strings(ids)}]"
    rows = client.query(
        collection,
        filter=expr,
        output_fields=FRAGMENT_FIELDS,
        limit=_QUERY_WINDOW,
        consistency_level="Strong",
        **opts,
    )
    return [(_context(row), int(row["strengthen_count"])) for row in rows]


def _context(row: dict[str, Any]) -> ContextFragment:
    """A fragment row (FRAGMENT_FIELDS) as the prompt gets it."""
    return ContextFragment(
        id=str(row["pk"]),
        theme=str(row["theme"]),
        types=list(row.get("types") or []),
        content=str(row["content"]),
        thread_id=str(row.get("thread_id") or ""),
        start_pos=int(row["start_pos"]),
        end_pos=int(row["end_pos"]),
        created_at=float(row["created_at"]),
    )
