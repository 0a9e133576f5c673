"""The fragment store: one Milvus collection of every user's fragments, reached by URI only.

Works the same against a Milvus Lite server (the embedded default), standalone or distributed
Milvus. Rules it keeps:

- User ids never enter a filter expression: rows carry `user_key` (a hex hash, the partition
  key) and every read filters on it, so a crafted user id cannot widen a query. Fragment ids
  are checked against a small alphabet before they appear in `pk in [...]`.
- Primary keys are business ids, so a retried index upserts the same rows.
- No retries here: a failure surfaces to Temporal, whose retry policy is the only one. Every
  call carries `retry_times=0` and a deadline (`timeout_s`, so a hung server cannot pin a worker
  thread); pymilvus still re-sends within that deadline once it has re-opened a dropped channel,
  which is bounded by `timeout_s` and fails in milliseconds while the server is down.
- The sync client and the embedder run in worker threads (`asyncio.to_thread`).

Flushing. Milvus Lite searches rows still in its memtable by brute force over *all* users'
unflushed rows and only indexes flushed segments; unflushed rows and deletes are already durable
(its WAL: measured, both survive a SIGKILL of the server). A flush therefore buys search speed,
not safety, and it costs ~20 ms, the largest part of a round's write. `benchmarks/milvus_flush.py`
played 1,000 rounds of 4 rows per policy on one server (docs/PERFORMANCE.md, "Milvus flush
policy"): a flush after every write cost 50.3 ms of store time per round, a flush once 64 rows
are unflushed 39.8 ms with later reads as fast (27 ms), never flushing 51.2 ms (reads over 4,000
unflushed rows, 77 ms). Every 512 rows was cheaper still (32.0 ms), but unflushed rows of all
workers add up in every search, and a busier run read 49 ms there against 27 at 64. So the store
flushes once `flush_rows` rows (default 64) were written by this process since its last flush; a
process leaves at most that many rows unflushed. Deletes always flush at once: a forget must not
leave the user's rows in the memtable. Standalone Milvus serves growing segments from its own
interim index and rate-limits flushes: pass `flush_rows=0` there (the store never flushes).
Lite builds a flushed segment's BM25 and vector indexes on the first search that reaches it, so
after each of its flushes the store searches each index once (`_warm`): the worker pays that
build, not the next agent's per-call search (its first search after a 600-line history was
written went from 25-35 ms to 20-25 ms in a scratch probe; the warm-up cannot reach the
segments Lite's own background compaction makes later).

Partition pruning on Milvus Lite. Lite routes rows to 16 hash buckets by the partition key but
does not prune by a `user_key == ...` filter: every read walks every row of every user in
Python (measured at 100k rows: 200-500 ms per read). Against Lite (recognised by its version
string) reads therefore name the user's bucket; Milvus proper prunes by itself and refuses
partition names on partition-key collections, so nothing changes there.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, ClassVar, TypeVar

from langchain_core.embeddings import Embeddings
from pymilvus import MilvusClient, MilvusException

from mnemoflow.activities.fragment_collection import (
    QUERY_WINDOW,
    create_if_missing,
    nearest,
    nearest_each,
    not_loaded,
    query_all,
)
from mnemoflow.activities.fragment_rows import (
    ALL_FIELDS,
    CALL_ID_MAX_BYTES,
    CONTENT_MAX_BYTES,
    NOTES_FIELD,
    SCALAR_FIELDS,
    checked_user,
    clip,
    cosines,
    ids_filter,
    storable_ids,
    to_fragment,
    to_row,
    types_filter,
    user_filter,
)
from mnemoflow.activities.line_rows import (
    build_line_schema,
    earlier_lines_collections,
    is_earlier_lines,
    line_index_params,
    line_rows,
    lines_collection,
)
from mnemoflow.activities.lite_writes import lite_write
from mnemoflow.activities.store_epochs import StoreEpochs
from mnemoflow.memory.lines import line_texts
from mnemoflow.models.errors import StaleEpochError
from mnemoflow.models.fragments import Candidate, Fragment

DEFAULT_COLLECTION = "mnemoflow_fragments"
#: Rows a process writes before the store flushes (module docstring, "Flushing").
FLUSH_ROWS = 64
# Milvus Lite's partition-key buckets (milvus_lite.constants DEFAULT_NUM_PARTITIONS and
# PARTITION_KEY_BUCKET_PREFIX; a bucket is md5(key) mod 16). ensure() checks they exist.
LITE_BUCKETS = 16
LITE_BUCKET_PREFIX = "_pk_"
#: A delete is read back, and done again while its rows are still there, this many times at most.
DELETE_ATTEMPTS = 3
T = TypeVar("T")
Rows = list[dict[str, Any]]
#: What a write must be checked against (activities/store_epochs.py): the rows it writes, by
#: user id, and the forget epoch it was asked for under.
Guard = tuple[dict[str, list[str]], int]
log = logging.getLogger(__name__)
#: The BM25 query of the warm-up after a flush (`FragmentStore._warm`): any text will do, the
#: search builds each segment's index before it scores.
WARM_TERMS = "warm"


# pymilvus pings every 10 s even with no call in flight; a gRPC server with default settings
# (Milvus Lite's) answers a few of those with GOAWAY "too many pings", which failed a fresh
# connection now and then (seen in CI). Ping rarely, and only while calls are in flight.
GRPC_OPTIONS = {
    "grpc.keepalive_time_ms": 300_000,
    "grpc.keepalive_permit_without_calls": False,
}


#: Query vectors a store keeps by exact text (`upsert_vectors(query=...)` embeds a round's
#: selection query in the same forward pass as its fragments, `candidates` finds it here).
QUERY_VECTORS_KEPT = 64
#: Longer queries are not kept (a round's query is at most 2,000 characters): the keys stay small.
QUERY_KEPT_CHARS = 4000
#: With a bounded `candidates` search, the nearest fragments of the always-injected types that
#: are added to the nearest ones (a type-floor seat needs a candidate to fill it).
FLOOR_CANDIDATES = 32
#: Fragment vectors a store keeps by exact text: `repeat_peers` embeds a round's fragments to find
#: their neighbours, and `upsert_vectors` then writes the ones that are new without embedding
#: them again.
DOC_VECTORS_KEPT = 256


def _oldest_first(rows: Rows) -> list[Fragment]:
    """The rows' fragments, oldest first (ties by id)."""
    return sorted((to_fragment(r) for r in rows), key=lambda f: (f.created_at, f.id))


def _best_first(rows: Rows, cos: Sequence[float]) -> list[Candidate]:
    """One candidate per row id (the first seen), best cosine first, ties by id."""
    best: dict[str, Candidate] = {}
    for row, c in zip(rows, cos, strict=True):
        if row["pk"] not in best:
            best[row["pk"]] = Candidate(fragment=to_fragment(row), cos=float(c))
    return sorted(best.values(), key=lambda c: (-c.cos, c.fragment.id))


class FragmentStore:
    """Async access to the fragment collection; one instance per worker process."""

    #: Flushes made by the stores of this process (benchmarks/throughput.py counts them per
    #: round: a flush is the largest part of a round's write, module docstring "Flushing").
    flushes_total: ClassVar[int] = 0
    #: Flushes after which this process's stores warmed Milvus Lite's indexes (`_warm`).
    warmups_total: ClassVar[int] = 0

    def __init__(
        self,
        uri: str,
        embeddings: Embeddings,
        *,
        token: str | None = None,
        collection: str = DEFAULT_COLLECTION,
        dim: int | None = None,
        index_type: str = "HNSW",
        timeout_s: float = 30.0,
        flush_rows: int = FLUSH_ROWS,
        epochs: StoreEpochs | None = None,
        lines: bool = False,
    ) -> None:
        """`epochs`: the users' forget epoch records every write that carries an epoch is
        checked against (the worker wiring always gives one; None: writes are not checked).
        `lines`: also keep one row per line of every fragment in the line collection
        (`activities/line_rows.py`), which the per-call search served by Milvus reads; the
        fragment's lines are written and deleted in the same call as the fragment."""
        resolved_dim = dim if dim is not None else getattr(embeddings, "dim", None)
        if not isinstance(resolved_dim, int) or resolved_dim < 1:
            raise ValueError("pass dim= (the embedder has no integer `dim` attribute)")
        self.uri = uri
        self.collection = collection
        self.lines_collection = lines_collection(collection) if lines else None
        #: Earlier versions' line collections found at `ensure` and not dropped yet
        #: (`_delete_lines`).
        self._earlier_lines: list[str] = []
        self.dim = resolved_dim
        self.index_type = index_type.upper()
        self.timeout_s = timeout_s
        if flush_rows < 0:
            raise ValueError("flush_rows must be >= 0 (0: never flush)")
        self.flush_rows = flush_rows
        self._unflushed = 0  # rows written by this process since its last flush
        self._flush_lock = threading.Lock()
        self._embeddings = embeddings
        # Only an embedder that says its queries and documents are embedded alike may embed a
        # query among documents (USE and the test hashing do; e5-style models do not).
        self._symmetric = bool(getattr(embeddings, "symmetric", False))
        self._query_vectors: OrderedDict[str, list[float]] = OrderedDict()
        self._doc_vectors: OrderedDict[str, list[float]] = OrderedDict()
        self._token = token or ""
        # whether the collection has the notes column (`ensure` finds out)
        self._notes = False
        self._client: MilvusClient | None = None
        self._connect_lock = threading.Lock()
        self._lite_buckets = False  # set by ensure() when the server is Milvus Lite
        #: Whether this store's `ensure` created the line collection (the worker then backfills
        #: it: `activities/line_backfill.py`).
        self.lines_created = False
        self._lite: bool | None = None  # Milvus Lite? asked once, before the first write
        self.epochs = epochs

    def __repr__(self) -> str:  # no token in logs
        return f"FragmentStore(uri={self.uri!r}, collection={self.collection!r}, dim={self.dim})"

    def _connected(self) -> MilvusClient:
        with self._connect_lock:
            if self._client is None:
                self._client = MilvusClient(
                    uri=self.uri,
                    token=self._token,
                    timeout=self.timeout_s,
                    grpc_options=GRPC_OPTIONS,
                )
            return self._client

    def _opts(self) -> dict[str, Any]:
        return {"timeout": self.timeout_s, "retry_times": 0}

    def _read_opts(self, key: str) -> dict[str, Any]:
        """Options of a read of one user's rows: on Milvus Lite, only the user's bucket; on
        any Milvus, strong consistency: a read right after an upsert must see it (a bounded
        read on a Milvus server may miss fresh rows, and induction would then mark facts it
        never saw as folded in, the corpus reconcile drop rows it did not see)."""
        opts = self._opts()
        opts["consistency_level"] = "Strong"
        if self._lite_buckets:
            bucket = int(hashlib.md5(key.encode()).hexdigest(), 16) % LITE_BUCKETS
            opts["partition_names"] = [f"{LITE_BUCKET_PREFIX}{bucket}"]
        return opts

    async def _run(self, fn: Callable[[MilvusClient], T]) -> T:
        try:
            return await asyncio.to_thread(self._call, fn)
        except MilvusException as exc:
            # pymilvus chains its reconnect attempts into a cause chain deep enough to overflow
            # Temporal's failure converter (RecursionError, measured with Milvus down): the
            # activity fails with the last error alone, and is retried as before.
            raise MilvusException(code=exc.code, message=exc.message) from None

    async def _run_write(self, fn: Callable[[MilvusClient], T], guard: Guard | None = None) -> T:
        """`_run` for a write: on Milvus Lite, one writer at a time (activities/lite_writes.py).
        A write whose caller was cancelled before the write began (an activity's timeout, while
        it queued for the lock) never begins: its thread cannot be stopped, and a write landing
        after its caller gave up could put back what a forget deleted meanwhile. A write with a
        `guard` is checked against the users' forget epochs before and after it is applied
        (`_checked`), in its own thread, whether or not its caller is still waiting."""
        called_off = threading.Event()
        try:
            return await asyncio.to_thread(self._call_write, fn, called_off, guard)
        except asyncio.CancelledError:
            called_off.set()
            raise
        except MilvusException as exc:
            raise MilvusException(code=exc.code, message=exc.message) from None

    def _call_write(
        self,
        fn: Callable[[MilvusClient], T],
        called_off: threading.Event | None = None,
        guard: Guard | None = None,
    ) -> T:
        if self._lite is None:
            try:
                version = self._connected().get_server_version(**self._opts())
            except MilvusException:
                version = None  # the write fails too (and is retried), or it succeeds
            if version is not None:
                self._lite = str(version).startswith("milvus_lite")
        if not self._lite:
            _go_on(called_off)
            return self._checked(fn, guard)
        with lite_write(self.uri):
            _go_on(called_off)
            return self._checked(fn, guard)

    def _checked(self, fn: Callable[[MilvusClient], T], guard: Guard | None) -> T:
        """Apply a write unless a user it writes for was forgotten after it was asked for, and
        take its rows out again if that happened while it was applied (docs/ARCHITECTURE.md,
        "Forget epochs"). A forget moves the record before it deletes: on Milvus Lite the check
        under the write lock is enough (the forget's delete waits for the lock); a production
        Milvus takes no lock, so the record is read again after the write, and a write that a
        forget overtook deletes its own rows, whichever of the two deletes comes last."""
        if guard is None or self.epochs is None:
            return self._call(fn)
        rows, epoch = guard
        for user_id in rows:
            self.epochs.check(user_id, epoch)
        out = self._call(fn)
        overtaken = [u for u in rows if self.epochs.current(u) > epoch]
        if overtaken:
            for user_id in overtaken:
                key = checked_user(user_id)
                lines_expr = _lines_of(key, rows[user_id])
                self._call(partial(_delete_line_rows, self, lines_expr))  # lines first
                self._call(partial(self._delete_rows, ids_filter(key, rows[user_id])))
            self._call(lambda c: self._flush(c))
            self.epochs.refused += 1  # counted once its rows are gone again
            log.warning("a store write overtaken by a forget took its rows out again")
            raise StaleEpochError(
                f"a store write of forget epoch {epoch} was overtaken by a forget: its rows "
                "were deleted again"
            )
        return out

    def _delete_rows(self, expr: str, client: MilvusClient) -> None:
        client.delete(self.collection, filter=expr, **self._opts())

    def _guard(self, fragments: list[Fragment], epoch: int | None) -> Guard | None:
        if epoch is None or self.epochs is None:
            return None
        rows: dict[str, list[str]] = {}
        for f in fragments:
            rows.setdefault(f.user_id, []).append(f.id)
        return rows, epoch

    def use_epochs(self, epochs: StoreEpochs) -> None:
        """Check this store's writes against `epochs` from now on (the worker wiring)."""
        self.epochs = epochs

    async def forget_epoch(self, user_id: str) -> int:
        """The user's forget epoch record (0 without records)."""
        checked_user(user_id)  # a usable user id, or InvalidInputError
        if self.epochs is None:
            return 0
        return await asyncio.to_thread(self.epochs.current, user_id)

    def _call(self, fn: Callable[[MilvusClient], T]) -> T:
        client = self._connected()
        try:
            return fn(client)
        except MilvusException as exc:
            if not not_loaded(exc):
                raise
        # A restarted Milvus Lite brings collections back released, the line collection as
        # well as the fragments'. Loading repairs server state (it is not a retry of a
        # failure), and every operation here is idempotent.
        for name in (self.collection, self.lines_collection):
            if name is not None:
                client.load_collection(name, **self._opts())
        return fn(client)

    def _flush(self, client: MilvusClient, rows: int | None = None) -> None:
        """Flush after `rows` rows were written, once `flush_rows` are unflushed (None: a delete,
        flushed at once)."""
        if not self.flush_rows:
            return
        with self._flush_lock:
            self._unflushed += rows or 0
            if rows is not None and self._unflushed < self.flush_rows:
                return
            client.flush(self.collection, **self._opts())
            if self.lines_collection is not None:
                client.flush(self.lines_collection, **self._opts())
            self._unflushed = 0
            FragmentStore.flushes_total += 1
        if self._lite:
            self._warm(client)

    def _warm(self, client: MilvusClient) -> None:
        """After a flush on Milvus Lite, one search of each index over every partition: Lite
        builds a flushed segment's search structures (the fragments' vector index, the lines'
        BM25 index) on the first search that reaches it, which would otherwise be an agent's
        per-call search (docs/PERFORMANCE.md, "Hot path"). Here the worker pays it, once per
        flush. A failure only leaves that cost to the next search."""
        probe = [1.0] + [0.0] * (self.dim - 1)
        dense = {"metric_type": "COSINE"}
        searches: list[tuple[str, Any, str, dict[str, Any]]] = [
            (self.collection, probe, "vector", dense)
        ]
        if self.lines_collection is not None:
            searches.append((self.lines_collection, WARM_TERMS, "sparse", {"metric_type": "BM25"}))
        try:
            for name, data, field, params in searches:
                client.search(
                    name,
                    data=[data],
                    anns_field=field,
                    search_params=params,
                    limit=1,
                    output_fields=["pk"],
                    **self._opts(),
                )
            FragmentStore.warmups_total += 1
        except MilvusException as exc:
            log.info("warming Milvus Lite's indexes after a flush failed: %s", exc.message)

    def _write(
        self, client: MilvusClient, rows: Rows, written: list[tuple[Fragment, list[float]]]
    ) -> None:
        """The fragments' rows, then their line rows (which carry the fragments' fields: every
        write of a fragment writes its lines), then the flush policy."""
        client.upsert(self.collection, rows, **self._opts())
        self._write_lines(client, [f for f, _ in written])
        self._flush(client, len(rows))

    def _write_lines(self, client: MilvusClient, written: list[Fragment]) -> None:
        """The written fragments' line rows, upserted in place of the lines they had (a search
        meanwhile sees the old row or the new one), then the positions past each fragment's
        new end deleted (a fragment stored again may have fewer lines); with the fragments' own
        write, under the same lock."""
        if self.lines_collection is None or not written:
            return
        name = self.lines_collection
        rows = [row for f in written for row in line_rows(f)]
        if rows:
            client.upsert(name, rows, **self._opts())
        ends: dict[str, dict[str, int]] = {}
        for f in written:
            ends.setdefault(checked_user(f.user_id), {})[f.id] = len(line_texts(f.content))
        for key, end in ends.items():
            # The positions past each fragment's end, found through the fragment_id index (a
            # delete by a filter on the position would scan every row in Lite, ~12 CPU-ms a
            # round); a new fragment has none, so most writes delete nothing.
            stored = client.query(
                name,
                filter=_lines_of(key, list(end)),
                output_fields=["pk", "fragment_id", "position"],
                limit=QUERY_WINDOW,
                **self._read_opts(key),
            )
            past = [r["pk"] for r in stored if int(r["position"]) >= end[str(r["fragment_id"])]]
            if past:
                client.delete(name, ids=past, **self._opts())

    def _delete_lines(self, client: MilvusClient, expr: str) -> None:
        """Delete line rows (before the delete's flush, which flushes both collections), in the
        earlier versions' line collections too while they exist: an agent of an earlier version
        searches its own until the migration drops it, and a fragment forgotten meanwhile must
        leave that search as well (README, "Lines in Milvus")."""
        if self.lines_collection is None:
            return
        client.delete(self.lines_collection, filter=expr, **self._opts())
        for name in list(self._earlier_lines):
            try:
                client.delete(name, filter=expr, **self._opts())
            except MilvusException:
                if client.has_collection(name, **self._opts()):
                    raise
                self._earlier_lines.remove(name)  # dropped meanwhile

    async def drop_earlier_lines(self) -> list[str]:
        """Drop the line collections an earlier version kept beside this fragment collection
        (once the current one is backfilled: nothing writes or deletes their rows any more, so
        a forgotten fragment's lines would stay there). Returns the names dropped."""
        if self.lines_collection is None:
            return []

        def work(client: MilvusClient) -> list[str]:
            dropped = self._earlier_present(client, self._opts())
            for name in dropped:
                client.drop_collection(name, **self._opts())
            self._earlier_lines = [n for n in self._earlier_lines if n not in dropped]
            return dropped

        return await self._run_write(work)

    async def _lines_left(self, key: str, ids: list[str] | None) -> int:
        """How many line rows of the user (of the fragments `ids`, None: all) are stored."""
        if self.lines_collection is None:
            return 0
        expr = user_filter(key) if ids is None else _lines_of(key, ids)
        opts, name = self._read_opts(key), self.lines_collection
        rows = await self._run(
            lambda c: c.query(name, filter=expr, output_fields=["count(*)"], **opts)
        )
        return int(rows[0]["count(*)"]) if rows else 0

    async def lined_ids(self, user_id: str) -> set[str]:
        """The ids of the user's fragments that have line rows (empty without lines)."""
        if self.lines_collection is None:
            return set()
        key = checked_user(user_id)
        expr, opts, name = user_filter(key), self._read_opts(key), self.lines_collection
        rows = await self._run(lambda c: query_all(c, name, expr, ["fragment_id"], opts))
        return {str(r["fragment_id"]) for r in rows}

    async def close(self) -> None:
        """Close the connection (a later call reconnects)."""
        with self._connect_lock:
            client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(client.close)

    @property
    def _scalar_fields(self) -> list[str]:
        return [*SCALAR_FIELDS, NOTES_FIELD] if self._notes else SCALAR_FIELDS

    async def drop(self) -> None:
        """Drop the whole collection (tests and benchmarks; forgetting uses delete_user)."""
        await self._run_write(lambda c: c.drop_collection(self.collection, **self._opts()))

    async def ensure(self) -> None:
        """Create the collection and its COSINE index if missing, then load it."""

        def work(client: MilvusClient) -> None:
            opts = self._opts()
            self._notes = create_if_missing(
                client, self.collection, self.dim, self.index_type, opts
            )
            client.load_collection(self.collection, **opts)
            if self.lines_collection is not None:
                self._ensure_lines(client, opts)
                self._earlier_lines = self._earlier_present(client, opts)
            self._lite_buckets = _has_lite_buckets(client, self.collection, opts)

        await self._run_write(work)

    def _earlier_present(self, client: MilvusClient, opts: dict[str, Any]) -> list[str]:
        """The earlier versions' line collections of this fragment collection that exist (a
        collection of such a name made by something else is not one: left alone)."""
        found = []
        for name in earlier_lines_collections(self.collection):
            if not client.has_collection(name, **opts):
                continue
            described = client.describe_collection(name, **opts)
            if is_earlier_lines(name, {f.get("name") for f in described.get("fields", [])}):
                found.append(name)
            else:
                log.warning("%s is not an earlier line collection: left alone", name)
        return found

    def _ensure_lines(self, client: MilvusClient, opts: dict[str, Any]) -> None:
        name = self.lines_collection
        assert name is not None
        if not client.has_collection(name, **opts):
            schema = build_line_schema()
            index = line_index_params()
            try:
                client.create_collection(name, schema=schema, index_params=index, **opts)
                self.lines_created = True
            except MilvusException:
                if not client.has_collection(name, **opts):
                    raise
        client.load_collection(name, **opts)

    async def upsert(self, fragments: list[Fragment], *, epoch: int | None = None) -> list[str]:
        """Embed and upsert fragments (same ids -> same rows); returns the ids written.
        `epoch`: the forget epoch the write was asked for under (StaleEpochError once a forget
        moved past it; None: not checked)."""
        return [f.id for f, _ in await self.upsert_vectors(fragments, epoch=epoch)]

    async def upsert_vectors(
        self, fragments: list[Fragment], *, query: str | None = None, epoch: int | None = None
    ) -> list[tuple[Fragment, list[float]]]:
        """As `upsert`, returning each written fragment with its vector.

        `query`: a selection query about to follow (`candidates`); with a symmetric embedder it
        is embedded in the same forward pass (one call instead of two: ~9 against ~12 CPU-ms
        for a fragment and a query with USE here) and kept for that call.
        """
        if not fragments:
            return []
        texts = [clip(f.content, CONTENT_MAX_BYTES) for f in fragments]
        vectors = await self._embed(texts, query)
        # The last of a repeated id wins, within a batch as across batches.
        written = {f.id: (f, v) for f, v in zip(fragments, vectors, strict=True)}
        rows = [to_row(f, v, notes=self._notes) for f, v in written.values()]
        pairs = list(written.values())
        guard = self._guard([f for f, _ in pairs], epoch)

        def work(client: MilvusClient) -> None:
            self._write(client, rows, pairs)  # flushes both collections when it flushes

        await self._run_write(work, guard)
        return pairs

    async def _embed(self, texts: list[str], query: str | None) -> list[list[float]]:
        """Vectors of `texts` (those `repeat_peers` embedded are reused, and kept no longer);
        a `query` about to be searched rides in the same forward pass and is kept."""
        kept = self._doc_vectors
        vectors: dict[int, list[float]] = {i: kept.pop(t) for i, t in enumerate(texts) if t in kept}
        todo = [i for i in range(len(texts)) if i not in vectors]
        along = query is not None and self._symmetric and query not in self._query_vectors
        batch = [texts[i] for i in todo] + ([query] if along and query is not None else [])
        if batch:
            made = await asyncio.to_thread(self._embeddings.embed_documents, batch)
            if along and query is not None:
                self._keep_query(query, made.pop())
            vectors.update(zip(todo, made, strict=True))
        return [vectors[i] for i in range(len(texts))]

    async def repeat_peers(
        self,
        user_id: str,
        fragments: list[Fragment],
        *,
        rounds: int,
        neighbours: int,
        query: str | None = None,
    ) -> list[Fragment]:
        """The user's stored fragments that new `fragments` (the user's) could repeat, or that
        changed what they say, oldest first: every fragment of the `rounds` rounds before the
        earliest of theirs, and the `neighbours` nearest each by vector (a read bounded by the
        round window, not by the user's history; docs/ARCHITECTURE.md "The round").

        The fragments' vectors are kept for the `upsert_vectors` that writes the new ones, and
        `query` rides in their forward pass as it would there."""
        key = checked_user(user_id)
        if not fragments:
            return []
        texts = [clip(f.content, CONTENT_MAX_BYTES) for f in fragments]
        vectors = await self._embed(texts, query)
        for text, vector in zip(texts, vectors, strict=True):
            self._doc_vectors[text] = vector
            self._doc_vectors.move_to_end(text)
        while len(self._doc_vectors) > DOC_VECTORS_KEPT:
            self._doc_vectors.popitem(last=False)
        since = min(f.round_no for f in fragments) - rounds
        expr, opts, kind = user_filter(key), self._read_opts(key), self.index_type
        # Rounds are numbered from 1: a window reaching round 0 holds the whole history, and
        # no neighbour can be outside it.
        whole = since <= 0
        window = expr if whole else f"{expr} and round_no >= {int(since)}"
        recent = await self._run(
            lambda c: query_all(c, self.collection, window, self._scalar_fields, opts)
        )
        near: list[list[dict[str, Any]]] = []
        if neighbours > 0 and not whole:
            n = min(neighbours, QUERY_WINDOW)
            near = await self._run(
                lambda c: nearest_each(
                    c, self.collection, vectors, expr, n, kind, self._scalar_fields, opts
                )
            )
        rows = {r["pk"]: r for r in recent}
        for hits in near:
            for h in hits:
                rows.setdefault(h["entity"]["pk"], h["entity"])
        return _oldest_first(list(rows.values()))

    async def _rows(self, key: str, ids: list[str], fields: list[str]) -> Rows:
        if not ids:
            return []
        expr = ids_filter(key, ids)
        opts = self._read_opts(key)
        return await self._run(
            lambda c: list(c.query(self.collection, filter=expr, output_fields=fields, **opts))
        )

    async def _user_rows(self, key: str, fields: list[str]) -> Rows:
        expr, opts = user_filter(key), self._read_opts(key)
        return await self._run(lambda c: query_all(c, self.collection, expr, fields, opts))

    async def get(self, user_id: str, ids: list[str]) -> list[Fragment]:
        """The user's fragments among `ids`, in the order asked (others' ids are ignored)."""
        wanted = storable_ids(ids)
        rows = await self._rows(checked_user(user_id), wanted, self._scalar_fields)
        by_id = {row["pk"]: to_fragment(row) for row in rows}
        return [by_id[i] for i in wanted if i in by_id]

    async def all_for_user(self, user_id: str) -> list[Fragment]:
        """Every fragment of the user, oldest first."""
        rows = await self._user_rows(checked_user(user_id), self._scalar_fields)
        return _oldest_first(rows)

    async def of_rounds(self, user_id: str, rounds: Sequence[int]) -> list[Fragment]:
        """The user's fragments stored by any of `rounds`, oldest first."""
        wanted = sorted({int(n) for n in rounds})
        if not wanted:
            return []
        key = checked_user(user_id)
        expr = f"{user_filter(key)} and round_no in [{', '.join(str(n) for n in wanted)}]"
        opts = self._read_opts(key)
        rows = await self._run(
            lambda c: query_all(c, self.collection, expr, self._scalar_fields, opts)
        )
        return _oldest_first(rows)

    async def highest_round(self, user_id: str) -> int:
        """The highest round number among the user's stored fragments (0 for none)."""
        rows = await self._user_rows(checked_user(user_id), ["round_no"])
        return max((int(r.get("round_no") or 0) for r in rows), default=0)

    async def all_with_vectors(self, user_id: str) -> list[tuple[Fragment, list[float]]]:
        """Every fragment of the user with its stored vector."""
        rows = await self._user_rows(checked_user(user_id), [*self._scalar_fields, "vector"])
        return [(to_fragment(r), [float(x) for x in r["vector"]]) for r in rows]

    async def candidates(
        self,
        user_id: str,
        query: str,
        limit: int | None,
        floor_types: Sequence[str] = (),
        held: Sequence[str] | None = None,
    ) -> list[Candidate]:
        """The user's fragments with their cosine to `query`, best first.

        `limit=None` scores all of the user's fragments (exact cosine in numpy; the read grows
        with the user's history). A number runs a filtered vector search for that many nearest
        fragments. When the user has that many or more, a fragment of an always-injected type
        (`floor_types`) far from the query must still compete for its seat
        (docs/ARCHITECTURE.md, "Selection"): with `held` (a round's store step: the fragments
        published last and the round's own), those ids are scored too, read by id; without, a
        second search adds the nearest `FLOOR_CANDIDATES` of the floor types (a filter that
        Milvus Lite evaluates row by row over the user's rows of those types).
        """
        key = checked_user(user_id)
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be >= 1 or None, got {limit}")
        qvec = self._query_vectors.get(query)
        if qvec is None:
            qvec = await asyncio.to_thread(self._embeddings.embed_query, query)
            self._keep_query(query, qvec)
        if limit is None:
            rows = await self._user_rows(key, [*self._scalar_fields, "vector"])
            return _best_first(rows, cosines([r["vector"] for r in rows], qvec) if rows else [])
        n, opts, kind = min(limit, QUERY_WINDOW), self._read_opts(key), self.index_type
        expr = user_filter(key)
        hits = await self._run(
            lambda c: nearest(c, self.collection, qvec, expr, n, kind, self._scalar_fields, opts)
        )
        rows = [h["entity"] for h in hits]
        cos = [float(h["distance"]) for h in hits]
        if len(hits) < n:  # every fragment of the user is here
            return _best_first(rows, cos)
        if held is not None:
            found = {r["pk"] for r in rows}
            ids = [i for i in storable_ids(list(held)) if i not in found]
            more = await self._rows(key, ids, [*self._scalar_fields, "vector"])
            rows += more
            cos += cosines([r["vector"] for r in more], qvec) if more else []
        elif floor := types_filter(floor_types):
            k, both = min(n, FLOOR_CANDIDATES), f"{expr} and {floor}"
            hits = await self._run(
                lambda c: nearest(
                    c, self.collection, qvec, both, k, kind, self._scalar_fields, opts
                )
            )
            rows += [h["entity"] for h in hits]
            cos += [float(h["distance"]) for h in hits]
        return _best_first(rows, cos)

    def _keep_query(self, query: str, vector: list[float]) -> None:
        if len(query) > QUERY_KEPT_CHARS:
            return
        self._query_vectors[query] = vector
        self._query_vectors.move_to_end(query)
        while len(self._query_vectors) > QUERY_VECTORS_KEPT:
            self._query_vectors.popitem(last=False)

    async def reinforce(
        self, user_id: str, ids: list[str], call_id: str, now: float, epoch: int | None = None
    ) -> int:
        """strengthen_count += 1 and reinforced_at = now, once per call id; returns rows changed.

        A row remembers the last call that strengthened it, so a retried activity (or a re-sent
        signal) skips rows it already changed. The user workflow applies calls one at a time, so
        a retry of call A cannot arrive after call B touched the same row.
        """
        fields = [*ALL_FIELDS, NOTES_FIELD] if self._notes else ALL_FIELDS
        rows = await self._rows(checked_user(user_id), storable_ids(ids), fields)
        stamp = clip(call_id, CALL_ID_MAX_BYTES)
        updated, lines = [], []
        for row in rows:
            if row.get("last_call_id") == stamp:
                continue
            fragment = to_fragment(row).model_copy(
                update={"strengthen_count": int(row["strengthen_count"]) + 1, "reinforced_at": now}
            )
            vector = [float(x) for x in row["vector"]]
            updated.append(to_row(fragment, vector, last_call_id=call_id, notes=self._notes))
            lines.append((fragment, vector))
        if updated:
            guard = None if epoch is None else ({user_id: [r["pk"] for r in updated]}, epoch)
            await self._run_write(lambda c: self._write(c, updated, lines), guard)
        return len(updated)

    async def count(self, user_id: str) -> int:
        """How many fragments the user has."""
        key = checked_user(user_id)
        expr, opts = user_filter(key), self._read_opts(key)
        rows = await self._run(
            lambda c: c.query(self.collection, filter=expr, output_fields=["count(*)"], **opts)
        )
        return int(rows[0]["count(*)"]) if rows else 0

    async def delete_user(self, user_id: str, epoch: int | None = None) -> int:
        """Delete every fragment of the user; returns how many there were. `epoch`: the user's
        new forget epoch, recorded before anything is deleted, so that no write asked for
        before it lands afterwards (`_checked`)."""
        key = checked_user(user_id)
        expr, opts = user_filter(key), self._opts()
        if epoch is not None and self.epochs is not None:
            await asyncio.to_thread(self.epochs.advance, user_id, epoch)
        before = await self.count(user_id)

        def work(client: MilvusClient) -> None:
            self._delete_lines(client, expr)  # the search reads lines: they go first
            client.delete(self.collection, filter=expr, **opts)
            self._flush(client)

        for _ in range(DELETE_ATTEMPTS):
            await self._run_write(work)
            if not await self.count(user_id) and not await self._lines_left(key, None):
                return before
        raise LostDeleteError(f"{DELETE_ATTEMPTS} deletes of a user's fragments left some stored")

    async def delete(self, user_id: str, ids: list[str]) -> int:
        """Delete the user's fragments among `ids` (others' ids delete nothing)."""
        key, wanted = checked_user(user_id), storable_ids(ids)
        present = [row["pk"] for row in await self._rows(key, wanted, ["pk"])]
        if not present:
            return 0
        left, opts = present, self._opts()
        for _ in range(DELETE_ATTEMPTS):
            expr = ids_filter(key, left)

            def work(client: MilvusClient, expr: str = expr, gone: list[str] = left) -> None:
                self._delete_lines(client, _lines_of(key, gone))  # the search reads lines
                client.delete(self.collection, filter=expr, **opts)
                self._flush(client)

            await self._run_write(work)
            # Read back: a delete that reported success yet left its row is done again.
            lines = await self._lines_left(key, left)
            left = [row["pk"] for row in await self._rows(key, left, ["pk"])]
            if not left and not lines:
                return len(present)
            left = left or present
        raise LostDeleteError(f"{DELETE_ATTEMPTS} deletes left {len(left)} fragment(s) stored")


def _lines_of(key: str, ids: list[str]) -> str:
    """One user's line rows of the fragments `ids` (already passed through `storable_ids`)."""
    return ids_filter(key, ids).replace(" and pk in [", " and fragment_id in [", 1)


class WriteCalledOffError(RuntimeError):
    """The write's caller was cancelled before the write began; nothing was written."""


def _go_on(called_off: threading.Event | None) -> None:
    if called_off is not None and called_off.is_set():
        raise WriteCalledOffError("the caller gave up before the write began: not written")


class LostDeleteError(RuntimeError):
    """A delete reported success and its rows were still stored (retryable)."""


def _has_lite_buckets(client: MilvusClient, collection: str, opts: dict[str, Any]) -> bool:
    """True when the server is Milvus Lite and the collection has its 16 key buckets."""
    try:
        lite = str(client.get_server_version(**opts)).startswith("milvus_lite")
        names = set(client.list_partitions(collection, **opts)) if lite else set()
    except MilvusException:
        return False
    return lite and names >= {f"{LITE_BUCKET_PREFIX}{i}" for i in range(LITE_BUCKETS)}


def _delete_line_rows(store: FragmentStore, expr: str, client: MilvusClient) -> None:
    """A write's line rows taken out again (`FragmentStore._checked`)."""
    store._delete_lines(client, expr)
