"""Throughput: end-to-end memory rounds per second on the embedded stack (this machine).

The embedded stack (Temporal dev server, Redis, Milvus Lite, one worker in this process) with
zero-latency heuristic memory models and the default embedding model (USE, 512 dims). U users
each hand over R rounds one after the other (a user's next event goes in once its previous one
is published, as a conversation would); the users run concurrently. Events are urgent (due at
once) and stamped now, so induction (due ~53 min after a fragment) stays out of the measured
rounds, as it would at conversation pace. Measured:

- rounds/s = U*R / wall time;
- latency from "event accepted" (signal-with-start returned) to "context published" (the read
  model in Redis holds a version whose indexed watermark covers the event);
- CPU seconds per process: this process (worker + load driver), Temporal dev server, Milvus Lite,
  Redis.

    python benchmarks/throughput.py [--short] [--users U] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import stack, summary_ms, write_result

TARGET_ROUNDS_PER_S = 20.0
#: Events are marked urgent (due at once) and stamped now, so fragments reach the long-term gate
#: ~53 min later, as in a real conversation: induction is not part of each measured round.
URGENT = True
POLL_S = 0.025


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its children."""
    import psutil

    try:
        proc = psutil.Process(pid)
        total = sum(proc.cpu_times()[:2])
        for kid in proc.children(recursive=True):
            try:
                total += sum(kid.cpu_times()[:2])
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return 0.0


class Watcher:
    """One loop that MGETs every awaited read-model key and resolves the waiting rounds."""

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.waiting: dict[str, tuple[str, int, asyncio.Future[float]]] = {}
        self._last: dict[str, bytes] = {}

    def wait(self, user: str, thread: str, end: int) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[user] = (thread, end, fut)
        return fut

    async def run(self) -> None:
        from mnemoflow.models.ids import context_key

        while True:
            users = list(self.waiting)
            if users:
                raws = await self.redis.mget([context_key(self.prefix, u) for u in users])
                now = time.perf_counter()
                for user, raw in zip(users, raws, strict=True):
                    if raw is None or raw == self._last.get(user):
                        continue
                    self._last[user] = raw
                    thread, end, fut = self.waiting[user]
                    mark = json.loads(raw).get("watermarks", {}).get(thread)
                    if mark and mark.get("indexed", 0) >= end and not fut.done():
                        del self.waiting[user]
                        fut.set_result(now)
            await asyncio.sleep(POLL_S)


async def _user(client: Any, watcher: Watcher, user: str, rounds: int, lat: list[float]) -> None:
    from mnemoflow.devstack.demo_story import SESSION_ONE
    from mnemoflow.models.turns import ChatTurn

    t0 = time.time()
    thread = "bench"
    for r in range(rounds):
        pos = 2 * r
        turns = [
            ChatTurn(
                thread_id=thread,
                position=pos,
                role="human",
                content=SESSION_ONE[r % len(SESSION_ONE)],
                time=t0 + pos * 35,
            ),
            ChatTurn(
                thread_id=thread,
                position=pos + 1,
                role="ai",
                content="Noted, thank you.",
                time=t0 + (pos + 1) * 35,
            ),
        ]
        done = watcher.wait(user, thread, pos + 2)
        await client.submit(user, turns, urgent=URGENT)
        accepted = time.perf_counter()
        published = await asyncio.wait_for(done, timeout=600)
        lat.append(published - accepted)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import os

    import redis.asyncio as aioredis

    from mnemoflow.worker.memory_client import memory_client

    users = args.users or (40 if args.short else 100)
    rounds = args.rounds or (5 if args.short else 10)
    async with stack(latency_s=0.0, tag="tput") as (info, settings, temporal):
        client = memory_client(temporal, settings)
        redis = aioredis.Redis.from_url(info.redis_url)
        watcher = Watcher(redis, settings.redis.key_prefix)
        poller = asyncio.create_task(watcher.run())
        # Warm-up (not measured): loads the embedding model, creates the first workflows.
        await asyncio.gather(*(_user(client, watcher, f"warm-{i}", 1, []) for i in range(4)))
        pids = {
            "worker_and_driver": os.getpid(),
            "temporal": info.service_pids.get("temporal", 0),
            "milvus": info.service_pids.get("milvus-lite", 0),
            "redis": info.service_pids.get("redis", 0),
        }
        cpu0 = {k: _cpu(p) for k, p in pids.items()}
        lat: list[float] = []
        tag = uuid.uuid4().hex[:6]
        print(f"{users} users x {rounds} rounds ...", flush=True)
        t0 = time.perf_counter()
        await asyncio.gather(
            *(_user(client, watcher, f"tput-{tag}-{u}", rounds, lat) for u in range(users))
        )
        wall = time.perf_counter() - t0
        cpu = {k: round(_cpu(p) - cpu0[k], 1) for k, p in pids.items()}
        poller.cancel()
        await redis.aclose()
        await client.aclose()
    total = users * rounds
    busy = sum(cpu.values())
    return {
        "users": users,
        "rounds_per_user": rounds,
        "rounds": total,
        "wall_s": round(wall, 2),
        "rounds_per_s": round(total / wall, 2),
        "accepted_to_published": summary_ms(lat),
        "cpu_s": cpu,
        "cpu_share": {k: round(v / busy, 3) if busy else 0.0 for k, v in cpu.items()},
        "cpu_utilisation_of_2_cores": round(busy / (wall * (os.cpu_count() or 2)), 3),
        "service_pids": {k: v for k, v in pids.items() if k != "worker_and_driver"},
        "target_rounds_per_s": TARGET_ROUNDS_PER_S,
        "met": total / wall >= TARGET_ROUNDS_PER_S,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="40 users x 5 rounds")
    parser.add_argument("--users", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="parse arguments and exit")
    parser.add_argument("--name", default="throughput", help="results file name")
    args = parser.parse_args()
    if args.dry_run:
        return 0
    result = asyncio.run(run(args))
    lat = result["accepted_to_published"]
    print(
        f"{result['rounds']} rounds in {result['wall_s']} s: {result['rounds_per_s']} rounds/s "
        f"(target {TARGET_ROUNDS_PER_S}: {'met' if result['met'] else 'MISSED'}); "
        f"accepted->published p50 {lat['p50_ms']:.0f} ms p95 {lat['p95_ms']:.0f} ms"
    )
    print("CPU seconds: " + ", ".join(f"{k} {v}" for k, v in result["cpu_s"].items()))
    write_result(args.name, result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
