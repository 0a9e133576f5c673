"""Retrieval: select latency against 10 to 3,000 fragments per user in a 10k / 100k store.

A Milvus Lite server (started here, temporary data dir) holds one collection filled by bulk
insert, flushed once at the end and indexed HNSW/COSINE (FragmentStore's defaults; the store
flushes after each write batch, so rows do not pile up in the brute-force memtable). Three
probe users own 10, 100, 1,000 and 3,000 fragments; filler users own the rest, 100 each. Timed, per
query: FragmentStore.candidates (query embedding + Milvus) and memory.selection.select (scoring),
for retrieve_k=None (every fragment of the user, exact cosine), retrieve_k=64 and 256 (an HNSW
search for the nearest, plus the fragments a round's store step holds, read by id: the 12 it
published last and its own 3; 256 is the default). Then
a round's two reads of the user's fragments (repeat peers, then candidates): the whole history
as before, against the bounded reads of the defaults. The query embedder here is a stub
returning a fixed unit vector, so Milvus and scoring are what is timed; the cost of embedding a
query with the default model (USE) is measured on its own and reported next to it.

    python benchmarks/retrieval.py [--short]      (short: 10k rows only)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import summary_ms, write_result

PROBES = {"u10": 10, "u100": 100, "u1000": 1000, "u3000": 3000}
FILLER_PER_USER = 100
DIM = 512
BATCH = 2000
TARGET_P95_MS = 50.0
TEXT = (
    "User: My order KX-{n} should arrive between 6 and 8 pm; the dog Biscuit chewed the last "
    "box, so please pack it well. Assistant: Noted."
)


class FixedQuery:
    """Embeddings stub: a fixed unit vector for every query (documents are inserted directly)."""

    dim = DIM

    def __init__(self, vector: list[float]) -> None:
        self.vector = vector

    def embed_query(self, text: str) -> list[float]:
        return self.vector

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self.vector for _ in texts]


def _rows(user: str, count: int, rng: np.random.Generator, start: float) -> list[dict[str, Any]]:
    from mnemoflow.activities.fragment_rows import to_row
    from mnemoflow.models.fragments import Fragment

    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    types = (["identity"], ["preference", "fact"], ["fact"], ["episode"], ["chat"])
    rows = []
    for i in range(count):
        fragment = Fragment(
            id=f"{user}.r{i // 4}.{i % 4}",
            user_id=user,
            theme=f"theme {i % 12}",
            types=types[i % len(types)],
            content=TEXT.format(n=i),
            created_at=start + i * 35,
            reinforced_at=start + i * 35,
            round_no=i // 4,
            thread_id="t",
            start_pos=i,
            end_pos=i + 1,
        )
        rows.append(to_row(fragment, vectors[i].tolist()))
    return rows


async def _fill(store: Any, total: int, rng: np.random.Generator) -> float:
    """Bulk insert up to `total` rows (probe users first), flush once; seconds taken."""
    started = time.perf_counter()
    start = time.time() - 86_400
    plan = list(PROBES.items())
    have = sum(PROBES.values())
    n = 0
    while have < total:
        count = min(FILLER_PER_USER, total - have)
        plan.append((f"filler{n}", count))
        have += count
        n += 1
    pending: list[dict[str, Any]] = []
    client = store._connected()
    for user, count in plan:
        pending += _rows(user, count, rng, start)
        if len(pending) >= BATCH:
            await asyncio.to_thread(client.insert, store.collection, pending)
            pending = []
    if pending:
        await asyncio.to_thread(client.insert, store.collection, pending)
    await asyncio.to_thread(client.flush, store.collection)
    return time.perf_counter() - started


async def _measure(store: Any, user: str, limit: int | None, queries: int) -> dict[str, Any]:
    from mnemoflow.memory.selection import select
    from mnemoflow.models.config import MemoryConfig
    from mnemoflow.models.params import TunedParams

    config = MemoryConfig(retrieve_k=limit)
    floor, held = config.always_inject_types, _held(user, config)
    cand_s, select_s, total_s = [], [], []
    for i in range(queries + 2):
        t0 = time.perf_counter()
        candidates = await store.candidates(user, "when is my parcel coming?", limit, floor, held)
        t1 = time.perf_counter()
        select(candidates, TunedParams(), config, time.time(), theme="delivery")
        t2 = time.perf_counter()
        if i >= 2:  # the first two warm the segment caches
            cand_s.append(t1 - t0)
            select_s.append(t2 - t1)
            total_s.append(t2 - t0)
    return {
        "candidates": len(candidates),
        "milvus_candidates": summary_ms(cand_s),
        "scoring": summary_ms(select_s),
        "select_total": summary_ms(total_s),
    }


def _held(user: str, config: Any) -> list[str]:
    """What a round's store step names as held: the published fragments (here the user's
    first `published_candidates`) and the round's own three."""
    published = [f"{user}.r{i // 4}.{i % 4}" for i in range(config.published_candidates)]
    return [*published, *(f"{user}.new.{k}" for k in range(3))]


async def _store_step_reads(store: Any, user: str, count: int, queries: int) -> dict[str, Any]:
    """A round's two reads of the user's stored fragments, before and now: the repeat filter's
    peers and the selection's candidates. Before (`history`): every fragment of the user,
    twice (once with its vector). Now (`bounded`, the defaults): the round window plus the
    nearest neighbours of the round's three fragments, then the nearest `retrieve_k`."""
    from mnemoflow.activities.fragments import REPEAT_NEIGHBOURS, REPEAT_ROUNDS
    from mnemoflow.models.config import MemoryConfig
    from mnemoflow.models.fragments import Fragment

    config, query = MemoryConfig(), "when is my parcel coming?"
    start = time.time()
    new = [
        Fragment(
            id=f"{user}.new.{k}",
            user_id=user,
            theme="delivery",
            types=["fact"],
            content=TEXT.format(n=f"new-{k}"),
            created_at=start,
            reinforced_at=start,
            round_no=count // 4 + 1,
        )
        for k in range(3)
    ]
    history, bounded, peers = [], [], 0
    for i in range(queries + 2):
        t0 = time.perf_counter()
        await store.all_for_user(user)
        await store.candidates(user, query, None)
        t1 = time.perf_counter()
        found = await store.repeat_peers(
            user, new, rounds=REPEAT_ROUNDS, neighbours=REPEAT_NEIGHBOURS, query=query
        )
        await store.candidates(
            user, query, config.retrieve_k, config.always_inject_types, _held(user, config)
        )
        t2 = time.perf_counter()
        peers = len(found)
        if i >= 2:
            history.append(t1 - t0)
            bounded.append(t2 - t1)
    return {"peers": peers, "history": summary_ms(history), "bounded": summary_ms(bounded)}


def _use_query_ms(samples: int) -> dict[str, Any]:
    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings

    use = UniversalSentenceEncoderEmbeddings()
    use.embed_query("warm up")
    took = []
    for i in range(samples):
        t0 = time.perf_counter()
        use.embed_query(f"What was my order number again? ({i})")
        took.append(time.perf_counter() - t0)
    return summary_ms(took)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.devstack.processes import free_port, start_milvus_lite
    from mnemoflow.models.config import MemoryConfig

    sizes = [10_000] if args.short else [10_000, 100_000]
    queries = 20 if args.short else 50
    rng = np.random.default_rng(7)
    query = rng.standard_normal(DIM).astype(np.float32)
    query = (query / np.linalg.norm(query)).tolist()
    out: dict[str, Any] = {"sizes": sizes, "queries_per_case": queries, "by_store_size": {}}
    with tempfile.TemporaryDirectory(prefix="mnemoflow-retrieval-") as tmp:
        port = free_port()
        milvus = await asyncio.to_thread(start_milvus_lite, port, tmp)
        try:
            for size in sizes:
                store = FragmentStore(
                    f"http://127.0.0.1:{port}", FixedQuery(query), collection=f"bench_{size}"
                )
                await store.ensure()
                print(f"filling {size:,} fragments ...", flush=True)
                fill_s = await _fill(store, size, rng)
                await store.ensure()  # reload after the flush so the index serves
                cases: dict[str, Any] = {"fill_s": round(fill_s, 1)}
                reads: dict[str, Any] = {}
                for user, count in PROBES.items():
                    for limit in (None, 64, 256):
                        key = f"{count}_per_user_retrieve_k_{limit or 'all'}"
                        cases[key] = await _measure(store, user, limit, queries)
                        t = cases[key]["select_total"]
                        print(
                            f"  {size:>7,} rows, {count:>5} per user, retrieve_k={limit}: "
                            f"p50 {t['p50_ms']:.1f} ms p95 {t['p95_ms']:.1f} ms",
                            flush=True,
                        )
                    r = reads[f"{count}_per_user"] = await _store_step_reads(
                        store, user, count, queries
                    )
                    print(
                        f"  {size:>7,} rows, {count:>5} per user, a round's reads: whole history "
                        f"p50 {r['history']['p50_ms']:.1f} ms, bounded p50 "
                        f"{r['bounded']['p50_ms']:.1f} ms ({r['peers']} repeat peers)",
                        flush=True,
                    )
                cases["store_step_reads"] = reads
                out["by_store_size"][str(size)] = cases
                await store.drop()
                await store.close()
        finally:
            await asyncio.to_thread(milvus.stop, 15.0)
    out["use_embed_query"] = _use_query_ms(queries)
    biggest = out["by_store_size"][str(sizes[-1])]
    default = f"_retrieve_k_{MemoryConfig().retrieve_k or 'all'}"
    worst = max(v["select_total"]["p95_ms"] for k, v in biggest.items() if k.endswith(default))
    out["target"] = {
        "store_size": sizes[-1],
        "retrieve_k": MemoryConfig().retrieve_k,
        "worst_p95_ms_excluding_query_embedding": worst,
        "target_ms": TARGET_P95_MS,
        "met": worst <= TARGET_P95_MS,
    }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="10k rows only")
    parser.add_argument("--dry-run", action="store_true", help="parse arguments and exit")
    args = parser.parse_args()
    if args.dry_run:
        return 0
    result = asyncio.run(run(args))
    t = result["target"]
    use = result["use_embed_query"]
    print(
        f"worst select p95 at {t['store_size']:,} rows, retrieve_k={t['retrieve_k']}: "
        f"{t['worst_p95_ms_excluding_query_embedding']} ms "
        f"(target {TARGET_P95_MS} ms: {'met' if t['met'] else 'MISSED'}); "
        f"+ USE query embedding p50 {use['p50_ms']} ms p95 {use['p95_ms']} ms"
    )
    write_result("retrieval", result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
