"""Milvus flush policy: what a round's write costs against what the next searches cost.

Milvus Lite searches rows that are not flushed yet by brute force over every user's unflushed
rows, and indexes flushed segments only; each flush also makes a segment. Three policies are run
side by side in one run, on one Milvus Lite server (started here, temporary data dir), each on
its own collection pre-filled with the same users' flushed rows:

- `every_write`: flush after every write batch (`flush_rows=1`, the store's former default);
- `every_<N>_rows`: flush once N rows are unflushed (`flush_rows=N`, 64 being the default;
  a round's write does not wait for a flush otherwise);
- `never`: no flush by the store (`flush_rows=0`; Milvus Lite's own timers only).

Each policy plays the same rounds: a user's round writes its fragments (4 rows) and then reads
that user's candidates, as the round's store step does. Timed: the write (upsert plus flush
when the policy flushes), the read right after it, and at the end a read per probe user on the
store as the rounds left it (segments and unflushed rows included). The embedder is a stub that
returns a seeded random unit vector per text, so Milvus is what is timed.

    python benchmarks/milvus_flush.py [--short]      (short: 200 rounds, else 1,000)
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import summary_ms, write_result

DIM = 512
USERS = 100
BASE_PER_USER = 50
ROWS_PER_ROUND = 4
THRESHOLDS = (64, 512)
PROBE_READS = 50


class SeededEmbeddings:
    """A unit vector per text, seeded by the text's hash (stable, cheap, spread out)."""

    dim = DIM

    def _one(self, text: str) -> list[float]:
        seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")
        v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
        return (v / np.linalg.norm(v)).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self._one(text)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._one(t) for t in texts]


def _fragments(user: int, round_no: int, count: int, at: float) -> list[Any]:
    from mnemoflow.models.fragments import Fragment

    return [
        Fragment(
            id=f"u{user}-r{round_no}-f{i}",
            user_id=f"user-{user}",
            theme=f"theme {i % 5}",
            types=["fact"],
            content=f"User: fact {i} of round {round_no} for user {user}. Assistant: Noted.",
            created_at=at,
            reinforced_at=at,
            round_no=round_no,
            thread_id="t",
            start_pos=i,
            end_pos=i + 1,
        )
        for i in range(count)
    ]


async def _play(store: Any, rounds: int, schedule: list[int]) -> dict[str, Any]:
    """The rounds under the store's flush policy; per-round write and read times, the flushes
    it made, and reads of the store as the rounds left it."""
    client = store._connected()
    flushes: list[float] = []
    flush = client.flush

    def counted(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return flush(*args, **kwargs)
        finally:
            flushes.append(time.perf_counter() - t0)

    client.flush = counted
    write_s, read_s = [], []
    now = time.time()
    for n in range(rounds):
        user = schedule[n]
        t0 = time.perf_counter()
        await store.upsert(_fragments(user, 10_000 + n, ROWS_PER_ROUND, now + n))
        t1 = time.perf_counter()
        await store.candidates(f"user-{user}", "what did I say?", None)
        t2 = time.perf_counter()
        write_s.append(t1 - t0)
        read_s.append(t2 - t1)
    probe = []
    for i in range(PROBE_READS + 2):
        t0 = time.perf_counter()
        await store.candidates(f"user-{i % USERS}", "what did I say?", None)
        if i >= 2:
            probe.append(time.perf_counter() - t0)
    client.flush = flush
    write = summary_ms(write_s)
    read = summary_ms(read_s)
    return {
        "flush_rows": store.flush_rows,
        "rounds": rounds,
        "write": write,
        "read_after_write": read,
        "flushes": len(flushes),
        "flush": summary_ms(flushes) if flushes else None,
        "round_store_mean_ms": round(write["mean_ms"] + read["mean_ms"], 2),
        "reads_after_the_rounds": summary_ms(probe),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.devstack.processes import free_port, start_milvus_lite

    rounds = 200 if args.short else 1000
    rng = np.random.default_rng(11)
    schedule = [int(u) for u in rng.integers(0, USERS, rounds)]
    policies = {"every_write": 1, **{f"every_{t}_rows": t for t in THRESHOLDS}, "never": 0}
    out: dict[str, Any] = {
        "users": USERS,
        "base_rows_per_user": BASE_PER_USER,
        "rows_per_round": ROWS_PER_ROUND,
        "policies": {},
    }
    emb = SeededEmbeddings()
    with tempfile.TemporaryDirectory(prefix="mnemoflow-flush-") as tmp:
        port = free_port()
        milvus = await asyncio.to_thread(start_milvus_lite, port, tmp)
        try:
            for policy, flush_rows in policies.items():
                store = FragmentStore(
                    f"http://127.0.0.1:{port}",
                    emb,
                    collection=f"flush_{policy}",
                    flush_rows=flush_rows,
                )
                await store.ensure()
                client = store._connected()
                from mnemoflow.activities.fragment_rows import to_row

                base = []
                for user in range(USERS):
                    frags = _fragments(user, 0, BASE_PER_USER, time.time() - 86_400)
                    vecs = emb.embed_documents([f.content for f in frags])
                    base += [to_row(f, v) for f, v in zip(frags, vecs, strict=True)]
                for start in range(0, len(base), 2000):
                    await asyncio.to_thread(
                        client.insert, store.collection, base[start : start + 2000]
                    )
                await asyncio.to_thread(client.flush, store.collection)
                await store.ensure()
                print(f"{policy}: {rounds} rounds ...", flush=True)
                result = await _play(store, rounds, schedule)
                out["policies"][policy] = result
                w = result["write"]
                print(
                    f"  write p50 {w['p50_ms']:.1f} p95 {w['p95_ms']:.1f}"
                    f" | read after p50 {result['read_after_write']['p50_ms']:.1f}"
                    f" p95 {result['read_after_write']['p95_ms']:.1f}"
                    f" | round mean {result['round_store_mean_ms']:.1f} ms"
                    f" | later reads p50 {result['reads_after_the_rounds']['p50_ms']:.1f}"
                    f" p95 {result['reads_after_the_rounds']['p95_ms']:.1f}",
                    flush=True,
                )
                await store.drop()
                await store.close()
        finally:
            await asyncio.to_thread(milvus.stop, 15.0)
    best = min(out["policies"], key=lambda p: out["policies"][p]["round_store_mean_ms"])
    out["cheapest_round_store"] = best
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="200 rounds per policy")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    write_result("milvus_flush", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
