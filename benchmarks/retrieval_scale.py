"""The per-call search as histories and users grow: served by Milvus against the agent-side index.

Side by side in one run, per (lines of the probed user, users in the store):

- `milvus`: `middleware.milvus_search.MilvusSearch` (the line collection's BM25 search and the
  fragment collection's vector search, whose hits carry their fragments; ranking in the agent;
  until commit 5afb2f0 one hybrid search of line rows that carried the vector), the rows
  written by the worker's `FragmentStore(lines=True)`;
- `agent_index`: the read path this project had before (`AgentIndex` below): a copy of every
  fragment with its vector in a Redis hash per user, read whole and built into an in-process
  `memory.search.SearchIndex` (`middleware.search.build_index`) whenever the user's version
  moved.

Per call: latency p50 / p95 with the query embedded by USE (the default model), agent-process
CPU per call (also by thread name, and less the process's background rate measured idle in the
same case times the call's duration: gRPC's runtime threads and the event loop cost CPU for
as long as a call waits on Milvus, which is what grows at 100,000 lines on Milvus Lite), Milvus
Lite server CPU per call; the agent index's build time after a round moved
the version; the agent's RSS after each side; the load average. Lines are LoCoMo turns (the
five given conversations, repeated with a counter past their ~3,000 lines), three to a fragment;
fragment vectors are random unit vectors (the latency of a search does not depend on what the
vectors mean; USE would take minutes to embed 100,000 lines), questions the LoCoMo questions.
The other users of the store own as many lines each as `--others-lines` (default 600), at most
`--others-total` lines together (default 100,000: among 10,000 users each other user owns 10), so
that the store of the largest case stays within what Milvus Lite fills in minutes.

    python benchmarks/retrieval_scale.py [--short] [--lines 600,10000,100000]
        [--users 1,100,10000] [--queries 60] [--paired 600,100000 | none]

`--paired`: after the cases, a user with each of the two line counts in one store, every
question asked of both in alternating order, each call's CPU read alone (`_paired`): the
agent's CPU per call at both sizes side by side, which the separate cases (each on a fresh
stack, minutes apart) cannot give within the machine's drift.

`--short`: 600 and 10,000 lines among 1 and 100 users, 20 calls per case (a few minutes; the
full run takes about half an hour, most of it filling the 10,000-user store). Under the protocol
(`benchmarks/_protocol.py retrieval_scale`) the headlines are the agent's CPU per call at the
first and the last case and the first case's p95.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, process_cpu_s, summary_ms, write_result
from _history import history_fragments, locomo_lines
from _locomo_data import conversations

DATA = ROOT.parent / "shared" / "data" / "locomo"  # as benchmarks/_locomo_offline.py
DIM = 512
BATCH = 600
CALL_TIMEOUT_S = 60.0
IDLE_S = 3.0


class RandomDocs:
    """Random unit vectors for documents, USE for queries (the query is embedded per call)."""

    dim = DIM

    def __init__(self, use: Any, seed: int = 0) -> None:
        self.use = use
        self.rng = np.random.default_rng(seed)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        m = self.rng.standard_normal((len(texts), DIM)).astype(np.float32)
        m /= np.linalg.norm(m, axis=1, keepdims=True)
        return m.tolist()  # type: ignore[no-any-return]

    def embed_query(self, text: str) -> list[float]:
        return self.use.embed_query(text)  # type: ignore[no-any-return]


class AgentIndex:
    """The agent-side search as it was: a Redis hash of corpus entries per user (written by
    `copy_in`, as the worker did), read whole and indexed in process, cached per version."""

    def __init__(self, redis: Any, prefix: str, embeddings: Any) -> None:
        self.redis, self.prefix, self.embeddings = redis, prefix, embeddings
        self._cached: dict[str, tuple[int, Any]] = {}

    def key(self, user: str) -> str:
        from mnemoflow.models.corpus import corpus_key

        return corpus_key(self.prefix, user)

    async def copy_in(self, pairs: list[tuple[Any, list[float]]]) -> None:
        from mnemoflow.models.corpus import BUMP_VERSION, CorpusEntry, corpus_version_key

        by_user: dict[str, dict[str, str]] = {}
        for f, v in pairs:
            by_user.setdefault(f.user_id, {})[f.id] = CorpusEntry.of_stored(f, v).model_dump_json()
        async with self.redis.pipeline(transaction=True) as pipe:
            for user, mapping in by_user.items():
                pipe.hset(self.key(user), mapping=mapping)
                pipe.eval(BUMP_VERSION, 1, corpus_version_key(self.prefix, user))
            await pipe.execute()

    async def index(self, user: str) -> Any:
        from mnemoflow.middleware.search import build_index
        from mnemoflow.models.corpus import corpus_version, corpus_version_key

        version = corpus_version(await self.redis.get(corpus_version_key(self.prefix, user)))
        cached = self._cached.get(user)
        if cached is not None and cached[0] == version:
            return cached[1]
        raw = await self.redis.hgetall(self.key(user))
        index = await asyncio.to_thread(build_index, raw, version)
        self._cached[user] = (version, index)
        return index

    async def search(self, user: str, query: str, config: Any, now: float) -> Any:
        index, vector = await asyncio.gather(
            self.index(user), asyncio.to_thread(self.embeddings.embed_query, query)
        )
        return await asyncio.to_thread(index.excerpts, query, vector, config, now)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def _fill(store: Any, corpus: Any, frags: list[Any]) -> float:
    started = time.perf_counter()
    for i in range(0, len(frags), BATCH):
        written = await store.upsert_vectors(frags[i : i + BATCH])
        await corpus.copy_in(written)
    return time.perf_counter() - started


def others_lines(wanted: int, total: int, users: int) -> int:
    """Lines each other user owns: `wanted`, unless the others together would pass `total`."""
    if users <= 1:
        return 0
    return max(1, min(wanted, total // (users - 1)))


def _threads_cpu_s() -> dict[str, float]:
    """CPU seconds of this process's threads so far, summed by thread name (Python's threads
    are all named `python`; gRPC's own runtime threads have names of their own), from the
    scheduler's nanosecond run time (`schedstat`). Linux only: empty elsewhere."""
    out: dict[str, float] = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ran_ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended
            continue
        out[name] = out.get(name, 0.0) + ran_ns / 1e9
    return out


async def _calls(search: Any, user: str, questions: list[str], milvus_pid: int) -> dict[str, Any]:
    """Timed calls, after a warm-up call and IDLE_S seconds of idling that measure the agent
    process's own background rate (gRPC's runtime threads, the event loop) with every client
    connected: the CPU a call costs less that rate times its duration is the work the call
    does, which does not grow with the time Milvus takes to answer."""
    from mnemoflow.models.config import MemoryConfig

    config, now = MemoryConfig(), time.time()
    try:  # connect, load, warm
        await search.search(user, questions[0], config, now)
    except Exception as err:  # counted below if the calls fail too
        print(f"warm-up call failed: {err!r}"[:300], flush=True)
    idle_rate = await _idle_rate()
    times, cpu0, mcpu0 = [], time.process_time(), process_cpu_s(milvus_pid, children=False)
    threads0 = _threads_cpu_s()
    failed = 0
    for q in questions:
        t0 = time.perf_counter()
        try:
            await search.search(user, q, config, now)
        except Exception:  # a call past its Milvus deadline: counted, timed as it took
            failed += 1
        times.append(time.perf_counter() - t0)
    n = len(questions)
    cpu = time.process_time() - cpu0
    threads = _threads_cpu_s()
    by_thread = {k: v - threads0.get(k, 0.0) for k, v in threads.items()}
    return {
        **summary_ms(times),
        "failed": failed,
        "over_250_ms": sum(t > 0.25 for t in times),
        "agent_cpu_ms_per_call": round(1e3 * cpu / n, 2),
        "agent_idle_cpu_ms_per_s": round(1e3 * idle_rate, 2),
        "agent_cpu_ms_per_call_less_idle": round(1e3 * (cpu - idle_rate * sum(times)) / n, 2),
        "agent_cpu_ms_per_call_by_thread": {
            k: round(1e3 * v / n, 2) for k, v in sorted(by_thread.items()) if v > 0
        },
        "milvus_cpu_ms_per_call": round(
            1e3 * (process_cpu_s(milvus_pid, children=False) - mcpu0) / n, 2
        ),
    }


@dataclass
class Stack:
    """One case's own Milvus Lite server and Redis, with the fragment store (line rows on)."""

    milvus: Any
    redis: Any
    uri: str
    store: Any


@asynccontextmanager
async def _stack(use: Any) -> AsyncIterator[Stack]:
    """A fresh Milvus Lite server and Redis in a temporary directory, stopped on the way out;
    documents are embedded as random vectors (`RandomDocs`), questions by `use`."""
    import redis.asyncio as aioredis

    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.devstack.processes import free_port, start_milvus_lite, start_redis

    with tempfile.TemporaryDirectory(prefix="mnemoflow-scale-") as tmp:
        milvus = start_milvus_lite(free_port(), Path(tmp) / "m")
        redis_proc = start_redis(free_port(), Path(tmp) / "r")
        redis = aioredis.Redis.from_url(f"redis://127.0.0.1:{redis_proc.port}/0")
        uri = f"http://127.0.0.1:{milvus.port}"
        docs: Any = RandomDocs(use)  # duck-typed Embeddings
        store = FragmentStore(uri, docs, collection="scale", lines=True, flush_rows=BATCH)
        try:
            await store.ensure()
            yield Stack(milvus, redis, uri, store)
        finally:
            await store.close()
            await redis.aclose()
            milvus.stop(timeout=5)
            redis_proc.stop(timeout=5)


async def _flush(store: Any) -> None:
    """Seal what was written (both collections), so that searches read indexed segments."""
    lines_name = store.lines_collection
    assert lines_name is not None
    await store._run_write(lambda c: (c.flush("scale"), c.flush(lines_name)))


async def _idle_rate() -> float:
    """The process's CPU seconds per second while it idles IDLE_S with its clients connected."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    await asyncio.sleep(IDLE_S)
    return (time.process_time() - cpu0) / (time.perf_counter() - t0)


def _served(uri: str, redis: Any, use: Any) -> Any:
    """The production search over the benchmark's store, with a deadline long enough that
    every call completes and is timed (the middleware's own is 2 s per Milvus call, then the
    published context)."""
    from mnemoflow.middleware.milvus_search import MilvusSearch

    return MilvusSearch(
        uri,
        collection="scale",
        embeddings=use,
        redis=redis,
        key_prefix="bench:",
        timeout_s=CALL_TIMEOUT_S,
    )


async def _case(
    lines: int, users: int, args: argparse.Namespace, texts: list[str], questions: list[str]
) -> dict[str, Any]:
    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.models.corpus import BUMP_VERSION, corpus_version_key

    use = UniversalSentenceEncoderEmbeddings()
    use.embed_query("warm up")
    out: dict[str, Any] = {"lines": lines, "users": users}
    async with _stack(use) as stack:
        store, redis = stack.store, stack.redis
        corpus = AgentIndex(redis, "bench:", use)
        now = time.time()
        fill = 0.0
        each = others_lines(args.others_lines, args.others_total, users)
        out["others_lines_each"] = each
        others: list[Any] = []  # the other users' fragments, BATCH at a time
        for u in range(users - 1):
            others += history_fragments(f"other{u}", each, texts, now)
            if len(others) >= BATCH or u == users - 2:
                fill += await _fill(store, corpus, others)
                others = []
        fill += await _fill(store, corpus, history_fragments("probe", lines, texts, now))
        await _flush(store)
        out["fill_s"] = round(fill, 1)
        load0 = os.getloadavg()
        rss0 = _rss_mb()
        served = _served(stack.uri, redis, use)
        out["milvus"] = await _calls(served, "probe", questions, stack.milvus.pid)
        out["milvus"]["agent_rss_mb_after"] = _rss_mb()
        out["milvus"]["agent_rss_mb_added"] = round(_rss_mb() - rss0, 1)
        await served.close()

        rss1 = _rss_mb()
        local = corpus
        builds = []
        for _ in range(3):  # a round moved the version: the next call reads and rebuilds
            await redis.eval(BUMP_VERSION, 1, corpus_version_key("bench:", "probe"))  # type: ignore[misc]
            t0 = time.perf_counter()
            await local.index("probe")
            builds.append(time.perf_counter() - t0)
        out["agent_index"] = await _calls(local, "probe", questions, stack.milvus.pid)
        out["agent_index"]["read_and_build"] = summary_ms(builds)
        out["agent_index"]["agent_rss_mb_after"] = _rss_mb()
        out["agent_index"]["agent_rss_mb_added"] = round(_rss_mb() - rss1, 1)
        out["load_avg_during"] = [round(x, 2) for x in load0]
        out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


async def _paired(sizes: tuple[int, int], texts: list[str], questions: list[str]) -> dict[str, Any]:
    """The agent's CPU per call for a small and a large user of one store, side by side:
    every question is asked of both, in alternating order, and each call's CPU is read
    alone, so that the machine's drift during the run falls on both alike. Per call, the CPU
    less the process's idle rate (measured as in `_calls`) times the call's duration."""
    from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings
    from mnemoflow.models.config import MemoryConfig

    use = UniversalSentenceEncoderEmbeddings()
    use.embed_query("warm up")
    users = {f"probe{n}": n for n in sizes}
    out: dict[str, Any] = {"lines": list(sizes), "calls_each": len(questions)}
    async with _stack(use) as stack:
        now = time.time()
        for user, lines in users.items():
            frags = history_fragments(user, lines, texts, now)
            for i in range(0, len(frags), BATCH):
                await stack.store.upsert_vectors(frags[i : i + BATCH])
        await _flush(stack.store)
        served = _served(stack.uri, stack.redis, use)
        try:
            config = MemoryConfig()
            for user in users:  # connect, load, warm
                await served.search(user, questions[0], config, now)
            rate = await _idle_rate()
            load0 = os.getloadavg()
            calls: dict[str, list[tuple[float, float]]] = {u: [] for u in users}
            threads: dict[str, dict[str, float]] = {u: {} for u in users}
            for k, q in enumerate(questions):
                for user in list(users)[:: 1 if k % 2 == 0 else -1]:
                    before = _threads_cpu_s()
                    c0, t0 = time.process_time(), time.perf_counter()
                    await served.search(user, q, config, now)
                    calls[user].append((time.process_time() - c0, time.perf_counter() - t0))
                    for name, v in _threads_cpu_s().items():
                        threads[user][name] = (
                            threads[user].get(name, 0.0) + v - before.get(name, 0.0)
                        )
        finally:
            await served.close()
    out["agent_idle_cpu_ms_per_s"] = round(1e3 * rate, 2)
    out["load_avg_during"] = [round(x, 2) for x in load0]
    n = len(questions)
    for user, lines in users.items():
        each = [c for c, _ in calls[user]]
        net = [c - rate * w for c, w in calls[user]]
        out[str(lines)] = {
            **summary_ms([w for _, w in calls[user]]),
            "agent_cpu_ms_per_call_p50": round(1e3 * float(np.median(each)), 2),
            "agent_cpu_ms_per_call_mean": round(1e3 * float(np.mean(each)), 2),
            "agent_cpu_ms_per_call_less_idle_p50": round(1e3 * float(np.median(net)), 2),
            "agent_cpu_ms_per_call_by_thread": {
                k: round(1e3 * v / n, 2) for k, v in sorted(threads[user].items()) if v > 0
            },
        }
    small, large = (out[str(x)] for x in sizes)
    for key in ("agent_cpu_ms_per_call_p50", "agent_cpu_ms_per_call_less_idle_p50"):
        out[f"ratio_{key}"] = round(large[key] / small[key], 3)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    convs = conversations(Path(args.data))
    texts = locomo_lines(Path(args.data))
    questions = [q["question"] for c in convs for q in c.questions][: args.queries]
    cases = []
    for users in [int(x) for x in args.users.split(",")]:
        for lines in [int(x) for x in args.lines.split(",")]:
            print(f"case: {lines} lines, {users} users", flush=True)
            case = await _case(lines, users, args, texts, questions)
            print(case, flush=True)
            cases.append(case)
    paired = None
    if args.paired:
        small, large = (int(x) for x in args.paired.split(","))
        print(f"paired: {small} and {large} lines, calls alternating", flush=True)
        paired = await _paired((small, large), texts, questions)
        print(paired, flush=True)
    return {
        "cases": cases,
        "paired": paired,
        "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--lines", default=None, help="default 600,10000,100000")
    parser.add_argument("--users", default=None, help="default 1,100,10000")
    parser.add_argument("--others-lines", type=int, default=600)
    parser.add_argument("--others-total", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=None, help="default 60")
    parser.add_argument(
        "--paired",
        default=None,
        help="two line counts whose users share one store, asked in alternation "
        "(default 600,100000; short 600,10000; 'none' to skip)",
    )
    parser.add_argument("--out", default="retrieval_scale")
    parser.add_argument(
        "--short",
        action="store_true",
        help="600 and 10,000 lines among 1 and 100 users, 20 calls per case",
    )
    args = parser.parse_args()
    # what is given wins; the rest is the short or the full size
    short = {"lines": "600,10000", "users": "1,100", "queries": 20, "paired": "600,10000"}
    full = {
        "lines": "600,10000,100000",
        "users": "1,100,10000",
        "queries": 60,
        "paired": "600,100000",
    }
    for name, value in (short if args.short else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.paired == "none":
        args.paired = None
    result = asyncio.run(run(args))
    write_result(args.out, result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
