"""Throughput: end-to-end memory rounds per second on the embedded stack (this machine).

The embedded stack (Temporal dev server, Redis, Milvus Lite, one worker in this process) with
zero-latency heuristic memory models and the default embedding model (USE, 512 dims). U users
each hand over R rounds one after the other (a user's next event goes in once its previous one
is published, as a conversation would); the users run concurrently. Events are urgent (due at
once) and stamped now, so induction (due ~53 min after a fragment) stays out of the measured
rounds, as it would at conversation pace.

Each round shape named by `--shapes` (workflows/memory_round.py: 1 classic, 2 lean, 3 lean with
local LLM attempts and bounded payloads, 4 as 3 with earlier fragments by reference and a compact
theme cache) is measured
in turn on the same stack, with its own users, so the shapes compare side by side as ratios.
Measured per shape:

- rounds/s = U*R / wall time;
- latency from "event accepted" (signal-with-start returned) to "context published" (the read
  model in Redis holds a version whose indexed watermark covers the event);
- CPU seconds per process, each counted apart: this process (worker + load driver; its
  children are not included), the Temporal dev server, Milvus Lite, Redis (each with its own
  descendants), read by pid; and the whole machine's busy time, so the CPU of everything else
  that ran meanwhile is on record;
- from the histories of every measured user and round: history events, workflow tasks and
  history bytes per round, for the user workflows and the rounds apart;
- load average and nice level of every process, at the start and the end.

`--one-user N` adds a single user handing over N rounds one after the other: history bytes of
each round, the user workflow's history length and bytes after each, and at the end how long a
status query and a full replay of that history take (what the continue-as-new bound trades).
Whether bytes per round stay flat is read three ways (`*_spread`): each round against round 1,
each round against the median of all, and the mean of every whole 10 rounds against the first
10's (the trend, apart from what one round's own messages and fragments weigh, and for the user
workflow how a round's completion and the next hand-over fall into its workflow tasks).

`--llm-latency-ms` gives the heuristic models a latency per call (default 0: a no-op LLM, so
the figures are the shape's own floor on this machine).

`--sqlite default,wal` measures on two stacks in turn: the dev server with SQLite's default
pragmas, then with the dev stack's (a write-ahead log synced at checkpoints,
devstack/temporal_dev.py); the one-user run goes on the last.

    python benchmarks/throughput.py [--short] [--users U] [--rounds R] [--shapes 3,4]
        [--one-user N] [--cache N] [--llm-latency-ms MS] [--sqlite default,wal]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    ROOT,
    machine_busy_s,
    process_cpu_s,
    process_nice,
    stack,
    summary_ms,
    write_result,
)

TARGET_ROUNDS_PER_S = 20.0
TARGET_CPU_MS_PER_ROUND = 60.0
TARGET_EVENTS_PER_ROUND = 20.0
TARGET_WORKFLOW_TASKS_PER_ROUND = 4.0
#: The production layout (split LLM queue, two worker processes): issue 31's targets.
TARGET_SPLIT_EVENTS_PER_ROUND = 24.0
TARGET_SPLIT_WORKFLOW_TASKS_PER_ROUND = 4.0
#: Events are marked urgent (due at once) and stamped now, so fragments reach the long-term gate
#: ~53 min later, as in a real conversation: induction is not part of each measured round.
URGENT = True
#: The Watcher's sweep of every awaited key, behind the keyspace notifications.
SWEEP_S = 1.0
HISTORY_FETCHES = 16
#: Seconds the stack is measured idle before each phase (its CPU per second doing nothing).
IDLE_S = 3.0


class Watcher:
    """Resolves a waiting round when its user's read-model key is written.

    Redis keyspace notifications name each context key a publish sets, and only that key is
    read: the load driver's cost follows the publishes, not how many rounds are awaited (the
    first version GET every awaited context every 25 ms, ~6 % of this process's CPU in a
    py-spy profile, counted in "worker_and_driver"). A slow sweep of every awaited key
    (`SWEEP_S`) covers a notification that never came.
    """

    def __init__(self, redis: Any, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.waiting: dict[str, tuple[str, str, int, asyncio.Future[float]]] = {}
        self.subscribed = asyncio.Event()

    def wait(self, user: str, thread: str, end: int) -> asyncio.Future[float]:
        from mnemoflow.models.ids import context_key

        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[context_key(self.prefix, user)] = (user, thread, end, fut)
        return fut

    def _seen(self, key: str, raw: bytes | None, now: float) -> None:
        entry = self.waiting.get(key)
        if entry is None or raw is None:
            return
        _user, thread, end, fut = entry
        mark = json.loads(raw).get("watermarks", {}).get(thread)
        if mark and mark.get("indexed", 0) >= end and not fut.done():
            del self.waiting[key]
            fut.set_result(now)

    async def run(self) -> None:
        await asyncio.gather(self._listen(), self._sweep())

    async def _listen(self) -> None:
        # K: keyspace events; $: string commands (the publish script's SET).
        await self.redis.config_set("notify-keyspace-events", "K$")
        channel = "__keyspace@0__:"
        pubsub = self.redis.pubsub()
        await pubsub.psubscribe(f"{channel}{self.prefix}*")
        self.subscribed.set()
        try:
            async for msg in pubsub.listen():
                if msg.get("type") != "pmessage":
                    continue
                name = msg["channel"]
                key = (name.decode() if isinstance(name, bytes) else name)[len(channel) :]
                if key in self.waiting:
                    raw = await self.redis.get(key)
                    self._seen(key, raw, time.perf_counter())
        finally:
            await pubsub.aclose()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            keys = list(self.waiting)
            if keys:
                raws = await self.redis.mget(keys)
                now = time.perf_counter()
                for key, raw in zip(keys, raws, strict=True):
                    self._seen(key, raw, now)


#: Words of `distinct_line`: every round of the one-user run says something new.
_WHO = ["my sister", "Priya", "our landlord", "the vet", "my coach", "Tomasz", "a colleague"]
_DID = ["booked", "cancelled", "moved", "paid for", "asked about", "planned", "forgot"]
_WHAT = [
    "a dentist visit",
    "the piano lesson",
    "a flight to Porto",
    "the car service",
    "a birthday dinner",
    "the gym membership",
    "a parcel return",
    "the tax form",
]
_WHEN = ["on Monday", "next week", "at 7:30", "before the 14th", "this weekend", "in March"]
_MORE = [
    "",
    " It matters because the last one went wrong.",
    " Please keep it in mind when I ask about my schedule later on.",
    " I paid with the card ending in {n} and kept the receipt number {m}.",
]


def distinct_line(r: int) -> str:
    """Round r's message in the one-user run: a different statement every round (so every
    round makes new fragments, as a real conversation does), of varying length."""
    rng = random.Random(r)
    more = rng.choice(_MORE).format(n=rng.randint(1000, 9999), m=rng.randint(10**5, 10**6))
    return (
        f"Note {r}: {rng.choice(_WHO)} {rng.choice(_DID)} {rng.choice(_WHAT)} "
        f"{rng.choice(_WHEN)}.{more}"
    )


async def _user(
    client: Any,
    watcher: Watcher,
    user: str,
    rounds: int,
    lat: list[float],
    *,
    distinct: bool = False,
) -> None:
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
                content=distinct_line(r) if distinct else SESSION_ONE[r % len(SESSION_ONE)],
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
        # The watermark counts the thread's messages indexed so far (2 per round).
        done = watcher.wait(user, thread, pos + 2)
        await client.submit(user, turns, urgent=URGENT)
        accepted = time.perf_counter()
        published = await asyncio.wait_for(done, timeout=600)
        lat.append(published - accepted)


# --- histories -----------------------------------------------------------------------------


#: Marker of a local activity's result (the Python SDK's core).
LOCAL_ACTIVITY_MARKER = "core_local_activity"
#: The versioning search attribute; an upsert of it alone is not billed (below).
CHANGE_VERSION = "TemporalChangeVersion"
#: Activities that heartbeat while they run (activities/heartbeat.py): the SDK sends the first
#: heartbeat at once and throttles the rest to one per 0.8 x the 10 s heartbeat timeout, so each
#: attempt records at least one heartbeat, a billed action that no history shows.
HEARTBEATING = {
    "mnemoflow.slice_and_tune",
    "mnemoflow.slice",
    "mnemoflow.tune",
    "mnemoflow.induct",
    "mnemoflow.index",
}


def history_figures(history: Any) -> dict[str, int]:
    """Events, workflow tasks (completed) and bytes (serialized events) of one history, and what
    explains a round that costs more than its shape: replays, retries, timeouts, and actions.

    - `sticky_misses`: workflow tasks scheduled on the normal queue after the first one. The
      worker keeps a workflow's state in its cache and is handed the next task on its sticky
      queue; a task on the normal queue means that worker evicted it (cache full, or an error)
      or the sticky queue timed out, and whichever worker takes the task replays the whole
      history first. `workflow_task_failures`: failed or timed-out workflow tasks (each also
      replayed).
    - `activity_retries`: attempts past the first (ActivityTaskStarted carries the attempt).
    - `local_activity_failures` / `local_activity_timeouts`: local-activity markers holding a
      failure / a timeout failure. `local_activity_retries`: local attempts past the first, as
      the markers record them (`_marker_attempt`): attempts that timed out or failed and were
      made again within the workflow task leave no event of their own, only the attempt number
      of the marker that followed, and their work was done twice.
    - `actions`: Temporal Cloud billable actions as the published definition counts them
      (docs/CAPACITY.md, "Temporal Cloud actions"): one per workflow run started (client start,
      signal-with-start, child start, continue-as-new), per signal received, per timer started,
      per search-attribute upsert (TemporalChangeVersion alone excepted), per update accepted,
      per activity attempt (retries included), and one per workflow task that recorded local
      activities (all of a workflow task's local activities are one action).
      `heartbeats_min`: attempts of heartbeating activities, each at least one heartbeat (an
      action too; histories do not record heartbeats), so `actions_with_heartbeats` is a floor.
    """
    from temporalio.api.enums.v1 import EventType, TaskQueueKind

    events = list(history.events)
    out = {
        "events": len(events),
        "workflow_tasks": 0,
        "bytes": sum(e.ByteSize() for e in events),
        "activities": 0,
        "markers": 0,
        "upserts": 0,
        "signals": 0,
        "timers": 0,
        "sticky_misses": 0,
        "workflow_task_failures": 0,
        "activity_retries": 0,
        "local_activity_failures": 0,
        "local_activity_timeouts": 0,
        "local_activity_retries": 0,
        "actions": 0,
        "heartbeats_min": 0,
    }
    types: dict[int, str] = {}  # scheduled event id -> activity type
    scheduled = 0
    task_with_local: set[int] = set()
    last_task = 0  # event id of the last completed workflow task
    for e in events:
        t = e.event_type
        if t == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled += 1
            kind = e.workflow_task_scheduled_event_attributes.task_queue.kind
            if scheduled > 1 and kind != TaskQueueKind.TASK_QUEUE_KIND_STICKY:
                out["sticky_misses"] += 1
        elif t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            out["workflow_tasks"] += 1
            last_task = e.event_id
        elif t in (
            EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
        ):
            out["workflow_task_failures"] += 1
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            out["activities"] += 1
            types[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = e.activity_task_started_event_attributes
            attempt = max(1, started.attempt)
            out["activity_retries"] += attempt - 1
            out["actions"] += attempt
            if types.get(started.scheduled_event_id) in HEARTBEATING:
                out["heartbeats_min"] += attempt
        elif t == EventType.EVENT_TYPE_MARKER_RECORDED:
            out["markers"] += 1
            marker = e.marker_recorded_event_attributes
            if marker.marker_name == LOCAL_ACTIVITY_MARKER:
                task_with_local.add(last_task)
                out["local_activity_retries"] += _marker_attempt(marker) - 1
                if marker.HasField("failure"):
                    out["local_activity_failures"] += 1
                    if marker.failure.HasField("timeout_failure_info"):
                        out["local_activity_timeouts"] += 1
        elif t == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            out["upserts"] += 1
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            if set(fields.indexed_fields) - {CHANGE_VERSION}:
                out["actions"] += 1
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            out["actions"] += 1
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            out["signals"] += 1
            out["actions"] += 1
        elif t == EventType.EVENT_TYPE_TIMER_STARTED:
            out["timers"] += 1
            out["actions"] += 1
        elif t == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            out["actions"] += 1
    out["actions"] += len(task_with_local)
    out["actions_with_heartbeats"] = out["actions"] + out["heartbeats_min"]
    return out


def _marker_attempt(marker: Any) -> int:
    """The attempt a local-activity marker recorded (its `data` detail, JSON); 1 when it
    records none or cannot be read."""
    try:
        payload = marker.details["data"].payloads[0].data
        return max(1, int(json.loads(payload).get("attempt") or 1))
    except (KeyError, IndexError, ValueError, TypeError, AttributeError):
        return 1


async def _fetch_all(temporal: Any, ids: list[str]) -> list[dict[str, int]]:
    gate = asyncio.Semaphore(HISTORY_FETCHES)

    async def one(workflow_id: str) -> dict[str, int]:
        async with gate:
            history = await temporal.get_workflow_handle(workflow_id).fetch_history()
            return {**history_figures(history), **event_types(history)}

    return list(await asyncio.gather(*(one(w) for w in ids)))


TYPE_PREFIX = "type:"


def event_types(history: Any) -> dict[str, int]:
    """How many events of each type one history holds (keys `type:<EVENT_TYPE>`, short)."""
    from temporalio.api.enums.v1 import EventType

    out: dict[str, int] = {}
    for e in history.events:
        name = TYPE_PREFIX + EventType.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
        out[name] = out.get(name, 0) + 1
    return out


def _sum(rows: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in rows:
        for k, v in row.items():
            out[k] = out.get(k, 0) + v
    return out


async def histories_per_round(temporal: Any, users: list[str], rounds: int) -> dict[str, Any]:
    """Sum the histories of the users' workflows and of their rounds, per round."""
    from mnemoflow.models.ids import round_workflow_id, user_workflow_id

    parents = [user_workflow_id(u) for u in users]
    children = [round_workflow_id(p, n) for p in parents for n in range(1, rounds + 1)]
    parent = _sum(await _fetch_all(temporal, parents))
    child = _sum(await _fetch_all(temporal, children))
    total = len(users) * rounds

    def per(d: dict[str, int]) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: round(v / total, 2) for k, v in d.items() if not k.startswith(TYPE_PREFIX)
        }
        # where the events come from: each event type per round, the most frequent first
        kinds = {k[len(TYPE_PREFIX) :]: v for k, v in d.items() if k.startswith(TYPE_PREFIX)}
        out["events_by_type"] = {
            k: round(v / total, 2) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])
        }
        return out

    both = {k: parent.get(k, 0) + child.get(k, 0) for k in {*parent, *child}}
    return {"user_workflow": per(parent), "round_workflow": per(child), "total": per(both)}


# --- one measured phase ----------------------------------------------------------------------


#: The load driver's process (the benchmark itself), read without its children: the services
#: and worker processes it started are read by their own pids.
DRIVER = ("worker_and_driver", "driver")


def sqlite_bytes(data_dir: str | None) -> int:
    """Bytes of the dev server's SQLite files (the database and its write-ahead log)."""
    if not data_dir:
        return 0
    base = Path(data_dir) / "temporal.db"
    return sum(
        p.stat().st_size for p in (base, Path(f"{base}-wal"), Path(f"{base}-shm")) if p.exists()
    )


class CpuMeter:
    """CPU seconds of each process (by pid, apart) and of the whole machine, between marks."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.t0 = time.perf_counter()
        self.cpu0 = {k: process_cpu_s(p, children=k not in DRIVER) for k, p in pids.items()}
        self.busy0 = machine_busy_s()

    def read(self) -> dict[str, Any]:
        wall = time.perf_counter() - self.t0
        cpu = {
            k: round(process_cpu_s(p, children=k not in DRIVER) - self.cpu0[k], 2)
            for k, p in self.pids.items()
        }
        ours = sum(cpu.values())
        machine = machine_busy_s() - self.busy0
        cores = os.cpu_count() or 2
        return {
            "wall_s": round(wall, 2),
            "cpu_s": cpu,
            "cpu_s_ours": round(ours, 2),
            "cpu_s_machine": round(machine, 2),
            "cpu_s_others": round(max(0.0, machine - ours), 2),
            "utilisation_ours": round(ours / (wall * cores), 3),
            "utilisation_machine": round(machine / (wall * cores), 3),
        }


async def _phase(
    client: Any,
    temporal: Any,
    watcher: Watcher,
    pids: dict[str, int],
    shape: int,
    users: int,
    rounds: int,
    *,
    data_dir: str | None = None,
    in_process: bool = True,
) -> dict[str, Any]:
    from mnemoflow.workflows import user_rounds

    user_rounds.ROUND_SHAPE = shape  # the user workflow module is shared with the sandbox
    tag = uuid.uuid4().hex[:6]
    names = [f"tput-{tag}-{u}" for u in range(users)]
    # Warm-up (not measured): the first workflows of this shape, their sandboxes.
    await asyncio.gather(*(_user(client, watcher, f"warm-{tag}-{i}", 1, []) for i in range(4)))
    from mnemoflow.activities.fragment_store import FragmentStore

    load0 = [round(x, 2) for x in os.getloadavg()]
    lat: list[float] = []
    print(f"shape {shape}: {users} users x {rounds} rounds ...", flush=True)
    # What the stack costs doing nothing (pollers, timers, the Go and Python runtimes): a cost
    # per second, not per round, which a slower run spreads over fewer rounds per second.
    idle = CpuMeter(pids)
    await asyncio.sleep(IDLE_S)
    idle_usage = idle.read()
    idle_ms_per_s = {
        k: round(1000 * v / idle_usage["wall_s"], 1) for k, v in idle_usage["cpu_s"].items()
    }
    db0, flushes0 = sqlite_bytes(data_dir), FragmentStore.flushes_total
    meter = CpuMeter(pids)
    await asyncio.gather(*(_user(client, watcher, n, rounds, lat) for n in names))
    usage = meter.read()
    db1, flushes1 = sqlite_bytes(data_dir), FragmentStore.flushes_total
    total = users * rounds
    wall = usage["wall_s"]
    result: dict[str, Any] = {
        "shape": shape,
        "users": users,
        "rounds_per_user": rounds,
        "rounds": total,
        "rounds_per_s": round(total / wall, 2),
        "accepted_to_published": summary_ms(lat),
        **usage,
        "cpu_ms_per_round": {k: round(1000 * v / total, 1) for k, v in usage["cpu_s"].items()},
        "cpu_ms_per_round_all": round(1000 * usage["cpu_s_ours"] / total, 1),
        "load_avg_1_5_15": {"start": load0, "end": [round(x, 2) for x in os.getloadavg()]},
        "nice": {k: process_nice(p) for k, p in pids.items()},
        "worker_rss_mb": _rss_mb(),
        # CPU-ms per second of each process with no rounds running, measured just before, and
        # what the run's CPU per round is without that idle cost over its wall time
        "idle_cpu_ms_per_s": idle_ms_per_s,
        "cpu_ms_per_round_less_idle": round(
            1000 * usage["cpu_s_ours"] / total - sum(idle_ms_per_s.values()) * wall / total,
            1,
        ),
        # the dev server's SQLite files at the phase's start and end (they grow with histories)
        "sqlite_bytes": {"start": db0, "end": db1},
        # flushes of the in-process worker's fragment store (None: the workers are processes of
        # their own, whose store this process does not see)
        "milvus_flushes_per_round": round((flushes1 - flushes0) / total, 3) if in_process else None,
    }
    result["history_per_round"] = await histories_per_round(temporal, names, rounds)
    # Floor of this shape on these cores: rounds/s if our processes had both cores to
    # themselves, at the CPU per round measured here.
    cores = os.cpu_count() or 2
    result["rounds_per_s_if_cpu_bound"] = round(
        1000 * cores / max(result["cpu_ms_per_round_all"], 1e-9), 1
    )
    return result


def _rss_mb() -> float:
    """Resident memory of this process (the worker holds its cached workflows here)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


#: The one-user run says something new every round (`distinct_line`); `--one-user-story`
#: repeats the demo story's lines instead (as runs before shape 4 did: from its second pass on,
#: repeats store nothing new).
ONE_USER_DISTINCT = True


async def _one_user(client: Any, temporal: Any, watcher: Watcher, rounds: int) -> dict[str, Any]:
    """One user, `rounds` rounds in a row: bytes per round, the user history's growth, and the
    cost of a status query and of a replay at the end."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import WorkflowHistory

    from mnemoflow.models.ids import round_workflow_id, user_workflow_id
    from mnemoflow.workflows.user_memory import UserMemoryWorkflow
    from mnemoflow.workflows.user_rounds import ROUND_SHAPE

    user = f"one-{uuid.uuid4().hex[:6]}"
    parent = user_workflow_id(user)
    print(f"one user x {rounds} rounds (shape {ROUND_SHAPE}) ...", flush=True)
    await _user(client, watcher, user, rounds, [], distinct=ONE_USER_DISTINCT)
    # Every run of the user workflow (it continues as new past its history bound); the first
    # one is the longest and shows the growth.
    runs = sorted(
        [w async for w in temporal.list_workflows(f"WorkflowId = '{parent}'")],
        key=lambda w: w.start_time,
    )
    runs_events, runs_bytes, continued_bytes = [], [], []
    for n, w in enumerate(runs):
        h = await temporal.get_workflow_handle(parent, run_id=w.run_id).fetch_history()
        runs_events.append(len(h.events))
        runs_bytes.append(sum(e.ByteSize() for e in h.events))
        if n:  # the state the run before handed over (its continue-as-new input)
            continued_bytes.append(h.events[0].ByteSize())
    history = await temporal.get_workflow_handle(parent, run_id=runs[0].run_id).fetch_history()
    # The user workflow's length and bytes after each round (at its child's completion).
    grown: list[tuple[int, int]] = []
    size = 0
    for i, e in enumerate(history.events, start=1):
        size += e.ByteSize()
        if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            grown.append((i, size))
    children = await _fetch_all(
        temporal, [round_workflow_id(parent, n) for n in range(1, rounds + 1)]
    )
    per_round_bytes = [c["bytes"] for c in children]
    resent = await _resent(
        temporal, user, [round_workflow_id(parent, n) for n in range(1, rounds + 1)]
    )
    user_bytes = [b - a for (_, a), (_, b) in zip([(0, 0), *grown[:-1]], grown, strict=True)]
    handle = temporal.get_workflow_handle(parent)
    queries = []
    for _ in range(5):
        t = time.perf_counter()
        await handle.query(UserMemoryWorkflow.status)
        queries.append(time.perf_counter() - t)
    replay_s = await asyncio.to_thread(_replay_seconds, history)  # the first run, whole
    # Replay of the history's first ~n events (cut after a workflow task): cost vs length.
    completed = [
        i
        for i, e in enumerate(history.events)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    ]
    # Keyed by the nominal length (the docs quote these keys); the events actually replayed,
    # cut after the first workflow task past it, are in `replay_events_at`.
    replay_at: dict[str, float] = {}
    replay_events: dict[str, int] = {}
    for n in (250, 500, 1000, 2000):
        cut = next((i for i in completed if i + 1 >= n), None)
        if cut is None:
            break
        prefix = WorkflowHistory(history.workflow_id, list(history.events[: cut + 1]))
        replay_at[str(n)] = round(await asyncio.to_thread(_replay_seconds, prefix), 3)
        replay_events[str(n)] = cut + 1

    def at(values: list[int], n: int) -> int:
        return values[min(n, len(values)) - 1]

    marks = sorted({1, 10, 50, 100, rounds} & set(range(1, rounds + 1)))
    first = [n for n in sorted({*marks, len(grown)}) if n <= len(grown)]

    def spread(values: list[int]) -> dict[str, Any]:
        """How far the values stray (the target: within 20 %): from the first one, from the
        median, and the means of 10 rounds from the first 10's (the trend)."""
        first = values[0] if values else 0
        middle = statistics.median(values) if values else 0
        # Whole windows only: a last one of a round or two is that round, not a trend.
        whole = len(values) - len(values) % 10 or len(values)
        windows = [round(statistics.fmean(values[i : i + 10])) for i in range(0, whole, 10)]

        def dev(vs: list[int] | list[float], ref: float) -> float:
            return round(max((abs(v - ref) / ref for v in vs), default=0.0) if ref else 0.0, 3)

        return {
            "first": first,
            "min": min(values, default=0),
            "max": max(values, default=0),
            "median": middle,
            "max_deviation_from_first": dev(values, first),
            "max_deviation_from_median": dev(values, middle),
            "means_of_10": windows,
            "max_deviation_of_means_of_10_from_first_10": dev(windows, windows[0])
            if windows
            else 0.0,
        }

    return {
        "rounds": rounds,
        "distinct_lines": ONE_USER_DISTINCT,
        "round_history_bytes": {str(n): at(per_round_bytes, n) for n in marks},
        # every round's history bytes and the user workflow's bytes for each round, 1..N
        "round_history_bytes_all": per_round_bytes,
        "round_history_bytes_spread": spread(per_round_bytes),
        "user_history_bytes_per_round_all": user_bytes,
        "user_history_bytes_spread": spread(user_bytes),
        "round_history_events_all": [c["events"] for c in children],
        # contents of earlier rounds' fragments that a round's result carried (the store step's
        # marker carries the same), and how many rounds before each was made
        "earlier_contents_per_round_all": [len(ages) for ages in resent],
        "earlier_contents_per_round_from_50": round(
            statistics.fmean([len(ages) for ages in resent[49:]] or [0]), 2
        ),
        "earlier_contents_made_rounds_before": sorted(a for ages in resent for a in ages),
        # the first run of the user workflow, after its n-th round
        "user_history_bytes_per_round": {str(n): at(user_bytes, n) for n in first},
        "user_history_events_after": {str(n): grown[n - 1][0] for n in first},
        "user_history_bytes_first_run": size,
        "user_history_events_first_run": len(history.events),
        "user_workflow_runs": len(runs),
        "user_history_events_per_run": runs_events,
        "user_history_bytes_per_run": runs_bytes,
        # every run's bytes over every round, the state each continue-as-new carries included
        "user_history_bytes_per_round_all_runs": round(sum(runs_bytes) / max(rounds, 1)),
        "continued_input_bytes": continued_bytes,
        "status_query": summary_ms(queries),
        "replay_s": round(replay_s, 3),
        "replay_s_at_events": replay_at,
        "replay_events_at": replay_events,
        "replay_ms_per_1000_events": round(1000 * replay_s / len(history.events) * 1000, 1),
    }


async def _resent(temporal: Any, user: str, ids: list[str]) -> list[list[int]]:
    """Per round: for each earlier fragment whose contents its result carried, how many rounds
    before it was made (the result as JSON: the embedded stack has no payload codec)."""
    from temporalio.api.enums.v1 import EventType

    def round_of(fid: str) -> int | None:  # models.ids.fragment_id: <user key>-r<n>-f<i>
        found = re.search(r"-r([0-9]+)-f[0-9]+$", fid)
        return int(found.group(1)) if found else None

    out: list[list[int]] = []
    for n, workflow_id in enumerate(ids, start=1):
        history = await temporal.get_workflow_handle(workflow_id).fetch_history()
        done = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
        ]
        if not done:
            out.append([])
            continue
        payload = done[0].workflow_execution_completed_event_attributes.result.payloads[0]
        result = json.loads(payload.data)
        own = {r["id"] for r in result.get("fragments", [])}
        made = [round_of(f["id"]) for f in result["context"]["fragments"]]
        out.append(
            [
                n - r
                for f, r in zip(result["context"]["fragments"], made, strict=True)
                if f["id"] not in own and r is not None
            ]
        )
    return out


def _replay_seconds(history: Any) -> float:
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
    from mnemoflow.workflows.user_memory import UserMemoryWorkflow

    replayer = Replayer(
        workflows=[UserMemoryWorkflow, MemoryRoundWorkflow], data_converter=pydantic_data_converter
    )
    t = time.perf_counter()
    asyncio.run(replayer.replay_workflow(history))
    return time.perf_counter() - t


# --- the production layout: two worker processes, split queues --------------------------------


def chart_llm_rate() -> float:
    """The LLM queue's activities per second as the Helm chart sets it (workers.llm)."""
    import yaml

    values = ROOT / "deploy" / "chart" / "mnemoflow" / "values.yaml"
    return float(yaml.safe_load(values.read_text())["workers"]["llm"]["activitiesPerSecond"])


class SplitWorker:
    """`mnemoflow worker` in a process of its own with one role, configured by environment
    variables only, as the chart's Deployments run it (deploy/chart)."""

    def __init__(self, role: str, env: dict[str, str], log: Path) -> None:
        from mnemoflow.devstack.processes import free_port

        self.role = role
        self.health_port = free_port()
        self.log_path = log
        full = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith(("TEMPORAL_", "MILVUS_", "REDIS_", "MNEMOFLOW_"))
            },
            **env,
            "MNEMOFLOW_WORKER_ROLE": role,
            "MNEMOFLOW_HEALTH_PORT": str(self.health_port),
            "MNEMOFLOW_METRICS_PORT": str(free_port()),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        self._log = log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "mnemoflow.ops.cli", "worker"],
            cwd=ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    async def ready(self, deadline_s: float = 120.0) -> None:
        import urllib.request

        def get() -> int:
            try:
                url = f"http://127.0.0.1:{self.health_port}/readyz"
                with urllib.request.urlopen(url, timeout=5) as resp:
                    return int(resp.status)
            except OSError:
                return 0

        end = time.monotonic() + deadline_s
        while await asyncio.to_thread(get) != 200:
            if self.popen.poll() is not None or time.monotonic() > end:
                raise SystemExit(
                    f"{self.role} worker not ready:\n{self.log_path.read_text()[-3000:]}"
                )
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)
        self._log.close()


async def start_split_workers(
    info: Any, settings: Any, args: argparse.Namespace
) -> tuple[Any, list[SplitWorker]]:
    """Two worker processes (role workflow, role llm) on queues of their own, the LLM queue at
    the chart's rate limit; the settings a client of theirs uses. The embedded stack's own
    worker stays idle on its queue (its polling is counted in the driver's CPU)."""
    queue = f"split-{uuid.uuid4().hex[:8]}"
    llm_queue = f"{queue}-llm"
    rate = args.llm_rate if args.llm_rate is not None else chart_llm_rate()
    env = {
        "TEMPORAL_ADDRESS": info.temporal_address,
        "TEMPORAL_NAMESPACE": info.namespace,
        "TEMPORAL_TASK_QUEUE": queue,
        "TEMPORAL_LLM_TASK_QUEUE": llm_queue,
        "MILVUS_URI": info.milvus_uri,
        "MILVUS_EMBEDDING": "use",
        "REDIS_URL": info.redis_url,
        "REDIS_KEY_PREFIX": settings.redis.key_prefix,
        "MNEMOFLOW_MODELS": "heuristic",
        "MNEMOFLOW_HEURISTIC_LATENCY_S": str(args.llm_latency_ms / 1000),
        "MNEMOFLOW_HTTP_HOST": "127.0.0.1",
        "MNEMOFLOW_DATA_DIR": info.data_dir,
    }
    if rate > 0:
        env["MNEMOFLOW_LLM_ACTIVITIES_PER_SECOND"] = str(rate)
    workers = [
        SplitWorker(role, env, Path(info.data_dir) / f"worker-{role}.log")
        for role in ("workflow", "llm")
    ]
    await asyncio.gather(*(w.ready() for w in workers))
    split = settings.model_copy(
        update={
            "temporal": settings.temporal.model_copy(
                update={"task_queue": queue, "llm_task_queue": llm_queue}
            )
        }
    )
    print(f"split layout: queues {queue} / {llm_queue}, LLM rate {rate}/s", flush=True)
    return split, workers


#: `--sqlite` modes: the dev server's SQLite pragmas (devstack/temporal_dev.py).
SQLITE_MODES: dict[str, dict[str, str] | None] = {
    "wal": None,  # the dev stack's own (SQLITE_PRAGMAS)
    "default": {},  # SQLite's defaults: rollback journal, synced at every commit
}


async def _on_stack(
    args: argparse.Namespace, mode: str, shapes: list[int], users: int, rounds: int, one_user: int
) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, Any] | None]:
    """The shape phases (and the one-user run) on a stack of their own, its dev server started
    with the `mode` SQLite pragmas."""
    import redis.asyncio as aioredis

    from mnemoflow.devstack import temporal_dev
    from mnemoflow.worker.memory_client import memory_client

    saved = temporal_dev.SQLITE_PRAGMAS
    pragmas = SQLITE_MODES[mode]
    if pragmas is not None:
        temporal_dev.SQLITE_PRAGMAS = pragmas
    try:
        async with stack(latency_s=args.llm_latency_ms / 1000, tag="tput") as (
            info,
            settings,
            temporal,
        ):
            split = args.layout == "split"
            workers: list[SplitWorker] = []
            if split:
                settings, workers = await start_split_workers(info, settings, args)
            client = memory_client(temporal, settings)
            redis = aioredis.Redis.from_url(info.redis_url)
            watcher = Watcher(redis, settings.redis.key_prefix)
            poller = asyncio.create_task(watcher.run())
            await asyncio.wait_for(watcher.subscribed.wait(), timeout=30)
            pids = {
                "driver" if split else "worker_and_driver": os.getpid(),
                **{f"worker_{w.role}": w.popen.pid for w in workers},
                "temporal": info.service_pids.get("temporal", 0),
                "milvus": info.service_pids.get("milvus-lite", 0),
                "redis": info.service_pids.get("redis", 0),
            }
            phases = []
            for shape in shapes:
                print(f"[sqlite {mode}, layout {args.layout}]", end=" ", flush=True)
                phase = await _phase(
                    client,
                    temporal,
                    watcher,
                    pids,
                    shape,
                    users,
                    rounds,
                    data_dir=info.data_dir,
                    in_process=not split,
                )
                phase["layout"] = args.layout
                phases.append({"sqlite": mode, **phase})
                print(
                    f"  {phase['rounds_per_s']} rounds/s, {phase['cpu_ms_per_round_all']} "
                    f"CPU-ms/round, {phase['history_per_round']['total']['events']} events and "
                    f"{phase['history_per_round']['total']['workflow_tasks']} workflow tasks "
                    "per round",
                    flush=True,
                )
            one = None
            if one_user:
                from mnemoflow.workflows import user_rounds

                user_rounds.ROUND_SHAPE = shapes[-1]
                one = await _one_user(client, temporal, watcher, one_user)
            poller.cancel()
            await redis.aclose()
            await client.aclose()
            for w in workers:
                w.stop()
    finally:
        temporal_dev.SQLITE_PRAGMAS = saved
    return phases, pids, one


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from mnemoflow.worker import app

    users = args.users or (40 if args.short else 100)
    rounds = args.rounds or (5 if args.short else 10)
    if not args.shapes:
        from mnemoflow.workflows.user_rounds import ROUND_SHAPE

        args.shapes = str(ROUND_SHAPE)
    shapes = [int(s) for s in args.shapes.split(",") if s]
    modes = [m for m in args.sqlite.split(",") if m]
    unknown = set(modes) - set(SQLITE_MODES)
    if unknown or not modes:
        raise SystemExit(f"--sqlite takes {', '.join(SQLITE_MODES)}; got {args.sqlite!r}")
    if args.cache:
        app.MAX_CACHED_WORKFLOWS = args.cache
    if args.layout == "split":
        from mnemoflow.workflows.user_rounds import ROUND_SHAPE

        # The worker processes run the shape their code sets; this process cannot change it.
        if shapes != [ROUND_SHAPE]:
            raise SystemExit(f"--layout split measures the shape in use ({ROUND_SHAPE}) only")
    phases: list[dict[str, Any]] = []
    one = None
    for n, mode in enumerate(modes):
        last = n == len(modes) - 1
        got, pids, one_run = await _on_stack(
            args, mode, shapes, users, rounds, args.one_user if last else 0
        )
        phases += got
        one = one_run if last else one
    chosen = phases[-1]
    out: dict[str, Any] = {
        "phases": phases,
        "service_pids": {k: v for k, v in pids.items() if k != "worker_and_driver"},
        "worker_cache": app.MAX_CACHED_WORKFLOWS,
        "llm_latency_ms": args.llm_latency_ms,
        "targets": {
            "rounds_per_s": TARGET_ROUNDS_PER_S,
            "cpu_ms_per_round": TARGET_CPU_MS_PER_ROUND,
            "events_per_round": TARGET_EVENTS_PER_ROUND,
            "workflow_tasks_per_round": TARGET_WORKFLOW_TASKS_PER_ROUND,
        },
        "chosen_shape": chosen["shape"],
        "layout": args.layout,
        "met": {
            "rounds_per_s": chosen["rounds_per_s"] >= TARGET_ROUNDS_PER_S,
            "cpu_ms_per_round": chosen["cpu_ms_per_round_all"] <= TARGET_CPU_MS_PER_ROUND,
            "events_per_round": chosen["history_per_round"]["total"]["events"]
            <= TARGET_EVENTS_PER_ROUND,
            "workflow_tasks_per_round": chosen["history_per_round"]["total"]["workflow_tasks"]
            <= TARGET_WORKFLOW_TASKS_PER_ROUND,
        },
    }
    if args.layout == "split":
        out["llm_activities_per_second"] = (
            args.llm_rate if args.llm_rate is not None else chart_llm_rate()
        )
        out["targets"] = {
            "events_per_round": TARGET_SPLIT_EVENTS_PER_ROUND,
            "workflow_tasks_per_round": TARGET_SPLIT_WORKFLOW_TASKS_PER_ROUND,
        }
        out["met"] = {
            "events_per_round": chosen["history_per_round"]["total"]["events"]
            <= TARGET_SPLIT_EVENTS_PER_ROUND,
            "workflow_tasks_per_round": chosen["history_per_round"]["total"]["workflow_tasks"]
            <= TARGET_SPLIT_WORKFLOW_TASKS_PER_ROUND,
        }
    if len(phases) > 1:
        base = phases[0]
        out["ratios_last_to_first"] = {
            "rounds_per_s": round(chosen["rounds_per_s"] / base["rounds_per_s"], 2),
            "cpu_ms_per_round_all": round(
                chosen["cpu_ms_per_round_all"] / base["cpu_ms_per_round_all"], 2
            ),
            **{
                f"{k}_per_round": round(
                    chosen["history_per_round"]["total"][k] / base["history_per_round"]["total"][k],
                    2,
                )
                for k in ("events", "workflow_tasks", "bytes")
            },
        }
    if one is not None:
        out["one_user"] = one
    if args.floor:
        out["floor"] = await _floor_beside(chosen, users, rounds, args)
    return out


async def _floor_beside(
    chosen: dict[str, Any], users: int, rounds: int, args: argparse.Namespace
) -> dict[str, Any]:
    """The floor measured in the same run, right after the real rounds, at the same size:
    benchmarks/round_floor.py's `production` shape (the same workflows and client path, every
    activity a no-op, Temporal and the worker alone, a fresh dev server), or in the split
    layout its `production_split` shape (the LLM activities on a queue of their own at the
    same rate limit, served by a second Worker). CPU per round read the same way (at the last
    round's end, all processes of the stack); what the round costs above it is what its
    activities do (embedding, Milvus, Redis). A floor from another run cannot say whether a
    total that moved between runs moved in the floor or the activities. The floor's events and
    workflow tasks per round are what the workflows cost with activities that cannot fail or
    wait: what the history targets are read against."""
    import round_floor

    split = args.layout == "split"
    shape = "production_split" if split else "production"
    floor_args = argparse.Namespace(
        users=users, rounds=rounds, shapes=shape, llm_rate=args.llm_rate if split else None
    )
    phase = (await round_floor.run(floor_args))["phases"][0]
    floor_cpu = phase["cpu_ms_per_round"]["all"]
    ours = chosen["cpu_ms_per_round_all"]
    tasks = phase["history_per_round"]["total"]["workflow_tasks"]
    task_target = (
        TARGET_SPLIT_WORKFLOW_TASKS_PER_ROUND if split else TARGET_WORKFLOW_TASKS_PER_ROUND
    )
    return {
        "what": f"round_floor.py --shapes {shape}, in this run after the real rounds",
        "shape": shape,
        "llm_activities_per_second": phase.get("llm_activities_per_second"),
        "round_shape": phase.get("round_shape"),
        "rounds_per_s": phase["rounds_per_s"],
        "cpu_ms_per_round": phase["cpu_ms_per_round"],
        "cpu_ms_per_round_all": floor_cpu,
        "events_per_round": phase["history_per_round"]["total"]["events"],
        "workflow_tasks_per_round": phase["history_per_round"]["total"]["workflow_tasks"],
        "load_avg_1_5_15": phase["load_avg_1_5_15"],
        "cpu_ms_per_round_above_floor": round(ours - floor_cpu, 1),
        "cpu_ratio_to_floor": round(ours / max(floor_cpu, 1e-9), 2),
        "floor_meets_cpu_target": floor_cpu <= TARGET_CPU_MS_PER_ROUND,
        "history_per_round": {
            k: phase["history_per_round"][k] for k in ("parent", "child", "total")
        },
        "floor_meets_workflow_task_target": tasks <= task_target,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="40 users x 5 rounds")
    parser.add_argument("--users", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=0)
    parser.add_argument(
        "--shapes",
        default="",
        help="round shapes measured in turn (1 classic, 2 lean, 3 lean with local LLM attempts, "
        "4 as 3 with earlier fragments by reference, 5 weights looked up, 6 one LLM activity "
        "on a queue of its own; default: the shape in use, workflows/user_rounds.ROUND_SHAPE)",
    )
    parser.add_argument("--one-user", type=int, default=0, help="rounds of one user (0: none)")
    parser.add_argument(
        "--one-user-story",
        action="store_true",
        help="the one-user run repeats the demo story's lines (default: a new line every round)",
    )
    parser.add_argument(
        "--sqlite",
        default="wal",
        help="dev server SQLite pragmas, each on a stack of its own, in turn: wal (the dev "
        "stack's), default (SQLite's own); e.g. default,wal",
    )
    parser.add_argument("--cache", type=int, default=0, help="worker's workflow cache (0: default)")
    parser.add_argument(
        "--llm-latency-ms", type=float, default=0.0, help="per memory-LLM call (0: no-op LLM)"
    )
    parser.add_argument(
        "--layout",
        choices=("embedded", "split"),
        default="embedded",
        help="embedded: one worker in this process, one queue (dev defaults); split: the "
        "chart's layout, a workflow worker and an LLM worker process on split queues, the LLM "
        "queue rate limited (results: throughput_split.json)",
    )
    parser.add_argument(
        "--llm-rate",
        type=float,
        default=None,
        help="split layout: LLM activities per second (default: the chart's; 0: unlimited)",
    )
    parser.add_argument(
        "--no-floor",
        dest="floor",
        action="store_false",
        help="skip the floor measured after the rounds (round_floor.py's production shape, "
        "production_split in the split layout; same size, in this run; results `floor`)",
    )
    parser.add_argument("--dry-run", action="store_true", help="parse arguments and exit")
    args = parser.parse_args()
    global ONE_USER_DISTINCT
    ONE_USER_DISTINCT = not args.one_user_story
    if args.dry_run:
        return 0
    result = asyncio.run(run(args))
    for p in result["phases"]:
        lat = p["accepted_to_published"]
        h = p["history_per_round"]["total"]
        print(
            f"shape {p['shape']}: {p['rounds']} rounds in {p['wall_s']} s = "
            f"{p['rounds_per_s']} rounds/s; accepted->published p50 {lat['p50_ms']:.0f} ms "
            f"p95 {lat['p95_ms']:.0f} ms; CPU-ms/round {p['cpu_ms_per_round']} "
            f"(all {p['cpu_ms_per_round_all']}); per round {h['events']} events, "
            f"{h['workflow_tasks']} workflow tasks, {h['bytes']:.0f} history bytes; machine "
            f"{p['utilisation_machine']:.0%} busy (ours {p['utilisation_ours']:.0%})"
        )
    if "floor" in result:
        f = result["floor"]
        print(
            f"floor in this run (no-op activities): {f['rounds_per_s']} rounds/s, "
            f"{f['cpu_ms_per_round_all']} CPU-ms/round, {f['events_per_round']} events, "
            f"{f['workflow_tasks_per_round']} workflow tasks per round; the rounds cost "
            f"{f['cpu_ms_per_round_above_floor']} CPU-ms above it (x{f['cpu_ratio_to_floor']})"
        )
    print(f"targets met: {result['met']}")
    write_result("throughput_split" if args.layout == "split" else "throughput", result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
