"""Round floor: what a memory round costs on this machine when its activities cost nothing.

The round's targets (20 rounds/s, 60 CPU-ms per round across all processes, on these 2 cores,
100 users x 10 rounds; docs/PERFORMANCE.md section 2) are read against this floor: what the
chosen shape costs with nothing but Temporal and the workflow code, side by side with two toy
shapes, in ONE run on ONE Temporal dev server (started as the embedded stack starts it:
`devstack.temporal_dev.start_temporal_dev`, the dev stack's SQLite pragmas, the mnemoflow search
attributes), one worker in this process, and nothing else: no LLM, no embeddings, no Milvus, no
Redis.

Shapes (`--shapes`, measured in the order given, each with users of its own):

- `production`: the real `UserMemoryWorkflow` driving the real `MemoryRoundWorkflow` at the
  production shape (`workflows/user_rounds.ROUND_SHAPE`, read at run time), driven through the
  production client path (`worker.memory_client.memory_client(...).submit(user, turns,
  urgent=True)`, signal-with-start) as benchmarks/throughput.py drives it. Every activity and
  local activity the round and the user workflow can call is registered under its production
  name (models.contracts.ActivityName, models.round_store.SLICE_AND_TUNE / STORE_ROUND,
  models.user_keys.DESTROY_USER_KEY) by a no-op that returns the smallest valid output at once
  (`NoopMemoryActivities`): the slice makes one fragment per round (one theme, so its weights
  are tuned in the first round and found "stored" from then on, as shape 5 finds them in
  Redis), the store step indexes exactly the fragments it was given and publishes a selection
  of those alone. So every round completes normally, with one fragment indexed.
- `production_split`: the same, in the Helm chart's layout (benchmarks/throughput.py
  `--layout split`): the LLM activities on a queue of their own (`TEMPORAL_LLM_TASK_QUEUE`),
  served by a second Worker in this process (worker/app.py `worker_plans`, role llm) at the
  chart's rate limit (`--llm-rate`, default the chart's `workers.llm.activitiesPerSecond`), so
  the round's slice-and-tune is an ordinary activity and the round takes a workflow task for
  its result. Not in the default `--shapes`: it runs at the rate limit (5 rounds/s at the
  chart's), and benchmarks/throughput.py measures it beside the split layout's real rounds.
- `child_local` (toy, `ToyWorkflow` here): a parent workflow per user takes a signal per round
  and starts a child workflow per round that runs 2 no-op local activities.
- `no_child` (toy, `ToyWorkflow` here): a parent workflow per user takes a signal per round and
  runs 2 ordinary no-op activities itself.
  The toys' signal-with-start carries the round number only (production's carries 2 turns).

Every shape: U users concurrently, each sends its next round once its previous one ended. A
round's end is seen in-process, with no polling: the round's last step (the no-op store step;
the toys' second no-op activity) resolves the user's future.

The worker is built with production's Worker arguments (worker/app.py `build_workers`: default
sandboxed workflow runner, `MAX_CACHED_WORKFLOWS`, `max_concurrent_activities` for activities
and local activities, graceful shutdown; Worker Versioning only when configured) after
`single_threaded_blas` and `workflow_bytecode_cache`, as `running_worker` does; no interceptors,
as `mnemoflow dev` runs none. The sandbox imports a workflow's module afresh for every workflow
run (every round's child): this module's top level is kept as light there as
workflows/memory_round.py's (one workflow type; contracts passed through; activities not declared
in the sandbox): ~1.1 against ~0.9 CPU-ms per import, measured outside the sandbox.

Measured per shape:

- rounds/s = U*R / wall time from the first submit to the last round's end;
- CPU seconds per process, each by its pid from /proc: the Temporal dev server (with its own
  descendants) and this process (worker + load driver; its children, i.e. the server, not
  included); the whole machine's busy time, so what *other* work took meanwhile is on record.
  Read at the last round's end (as benchmarks/throughput.py does) and again once both processes
  went quiet after it (`settled`: the last rounds' completions and their parents' workflow
  tasks run after their last step; idle CPU meanwhile is included);
- from the fetched histories of every measured user (parent) and round (child): history
  events, workflow tasks (completed), activities scheduled, markers (local activities),
  search-attribute upserts and history bytes, per round, parent and child apart and together;
- load average at the start and the end, nice level of each process, latency from submit to
  the round's last step.

    python benchmarks/round_floor.py [--short] [--users 100] [--rounds 10]
        [--shapes production,child_local,no_child] [--llm-rate R]

`--short` (20 users x 3 rounds, as `make bench` runs it) is a quick smoke run. Results:
benchmarks/results/round_floor.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from mnemoflow.models.contracts import (
        ActivityName,
        ContextFragment,
        DeleteFragmentsInput,
        DeleteFragmentsOutput,
        DeleteReadModelInput,
        DeleteReadModelOutput,
        IndexInput,
        IndexOutput,
        InductInput,
        InductOutput,
        PublishInput,
        PublishOutput,
        RankedRef,
        ReinforceInput,
        ReinforceOutput,
        SelectInput,
        SelectOutput,
        SliceInput,
        SliceOutput,
        TuneInput,
        TuneOutput,
    )
    from mnemoflow.models.fragments import FragmentDraft, SelectionLog, theme_key
    from mnemoflow.models.params import TunedParams
    from mnemoflow.models.round_store import (
        SLICE_AND_TUNE,
        STORE_ROUND,
        STORED_FLOOR,
        SliceTuneInput,
        SliceTuneOutput,
        StoredFloorInput,
        StoredFloorOutput,
        StoreRoundInput,
        StoreRoundOutput,
        pack_params,
        short_id,
        theme_ref,
    )
    from mnemoflow.models.user_keys import (
        DESTROY_USER_KEY,
        DestroyUserKeyInput,
        DestroyUserKeyOutput,
    )

SHAPES = ("production", "child_local", "no_child", "production_split")
#: The shapes driven through the production client path (the others are the toys).
PRODUCTION_SHAPES = ("production", "production_split")
#: `--shapes` by default (production_split runs at the LLM queue's rate limit: its own run).
DEFAULT_SHAPES = ("production", "child_local", "no_child")
TARGET_ROUNDS_PER_S = 20.0
TARGET_CPU_MS_PER_ROUND = 60.0
#: Users of each shape's warm-up (one round each, not measured): the first workflows of the
#: shape, their sandboxes and bytecode.
WARM_USERS = 4
#: A round that has not ended after this long fails the run (nothing here should take seconds).
ROUND_DEADLINE_S = 120.0
#: "Settled": both processes together used less than this share of one core over a window.
QUIET_CORES = 0.06
QUIET_WINDOW_S = 0.5
SETTLE_MAX_S = 20.0
HISTORY_FETCHES = 16
#: The one theme of the no-op slice (every round's fragment).
THEME = "floor"
TOY_NOOP = "round_floor.noop"
TOY_NOOP_END = "round_floor.noop_end"
TOY_TIMEOUT = timedelta(seconds=30)
#: The workflow sandbox imports this module afresh for every run of a toy workflow (as it imports
#: workflows/memory_round.py for every round), so its top level is kept light there: the
#: contracts above are passed through, and the activities below are not declared (`defn`).
IN_SANDBOX = workflow.unsafe.in_sandbox()


def defn(name: str) -> Any:
    """`activity.defn(name=...)` outside the sandbox; nothing in it (it never runs activities,
    and each decorator costs ~0.2 ms of every toy workflow run's import of this module)."""
    return (lambda fn: fn) if IN_SANDBOX else activity.defn(name=name)


# --- round ends, seen in-process --------------------------------------------------------------


class RoundEnds:
    """One future per user, resolved (with time.perf_counter()) by the round's last step."""

    def __init__(self) -> None:
        self.waiting: dict[str, asyncio.Future[float]] = {}
        self.count = 0

    def expect(self, key: str) -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiting[key] = fut
        return fut

    def done(self, key: str) -> None:
        self.count += 1
        fut = self.waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(time.perf_counter())


# --- the production shape's no-op activities ------------------------------------------------


def _one_draft(inp: SliceInput) -> SliceOutput:
    """One fragment of the whole batch: the first human line (or the first line)."""
    human = [t for t in inp.turns if t.role == "human" and t.content]
    content = (human or inp.turns)[0].content or "-"
    draft = FragmentDraft(
        theme=THEME, types=["fact"], content=content, start_idx=0, end_idx=len(inp.turns) - 1
    )
    return SliceOutput(drafts=[draft], model="noop")


class NoopMemoryActivities:
    """Every activity and local activity of the round and the user workflow, under its
    production name, answering the smallest valid output at once.

    `stored` stands for shape 5's theme weights in Redis: the store step "stores" the weights a
    round tuned, and the slice-and-tune step finds them from the user's second round on, as the
    real ones do (so a round tunes nothing once its theme is known)."""

    def __init__(self, ends: RoundEnds) -> None:
        self.ends = ends
        self.stored: dict[str, set[str]] = {}

    @defn(SLICE_AND_TUNE)
    async def slice_and_tune(self, inp: SliceTuneInput) -> SliceTuneOutput:
        sliced = _one_draft(inp.slice)
        key = theme_key(THEME)
        if key in inp.cached or theme_ref(key) in inp.cached:
            return SliceTuneOutput(sliced=sliced)
        if inp.lookup_user and key in self.stored.get(inp.lookup_user, set()):
            return SliceTuneOutput(sliced=sliced, looked_up={key: pack_params(TunedParams())})
        return SliceTuneOutput(
            sliced=sliced, tuned={key: TuneOutput(params=TunedParams(), model="noop")}
        )

    @defn(ActivityName.SLICE)
    async def slice(self, inp: SliceInput) -> SliceOutput:
        return _one_draft(inp)

    @defn(ActivityName.TUNE)
    async def tune(self, inp: TuneInput) -> TuneOutput:
        cached = bool(inp.lookup_user) and theme_key(inp.theme) in self.stored.get(
            inp.lookup_user, set()
        )
        return TuneOutput(params=TunedParams(), model="noop", cached=cached)

    @defn(STORED_FLOOR)
    async def stored_floor(self, inp: StoredFloorInput) -> StoredFloorOutput:
        return StoredFloorOutput()

    @defn(STORE_ROUND)
    async def store_round(self, inp: StoreRoundInput) -> StoreRoundOutput:
        user = inp.select.user_id
        if inp.new_weights:
            self.stored.setdefault(user, set()).update(inp.new_weights)
        ids = [f.id for f in inp.fragments]
        if inp.known is None:  # shapes 1-2: every published fragment's contents
            contents, ranked = [ContextFragment.of(f, 1.0) for f in inp.fragments], []
        else:  # shape 3 on: by id and score; the round holds its own fragments' contents
            known = set(inp.known)
            contents = [ContextFragment.of(f, 1.0) for f in inp.fragments if f.id not in known]
            ranked = [RankedRef(id=short_id(user, i), score=1.0) for i in ids]
        self.ends.done(user)
        return StoreRoundOutput(indexed=ids, fragments=contents, ranked=ranked, candidates=len(ids))

    @defn(ActivityName.INDEX)
    async def index(self, inp: IndexInput) -> IndexOutput:
        return IndexOutput(ids=[f.id for f in inp.fragments])

    @defn(ActivityName.SELECT)
    async def select(self, inp: SelectInput) -> SelectOutput:
        log = SelectionLog(at=inp.now, theme=inp.theme, params_source=inp.params_source)
        return SelectOutput(fragments=[], log=log)

    @defn(ActivityName.PUBLISH)
    async def publish(self, inp: PublishInput) -> PublishOutput:
        return PublishOutput(key="", bytes=0)

    @defn(ActivityName.INDUCT)
    async def induct(self, inp: InductInput) -> InductOutput:
        return InductOutput(profile=inp.profile, inducted=list(inp.fragment_ids), model="noop")

    @defn(ActivityName.REINFORCE)
    async def reinforce(self, inp: ReinforceInput) -> ReinforceOutput:
        return ReinforceOutput(updated=len(inp.fragment_ids))

    @defn(ActivityName.DELETE_FRAGMENTS)
    async def delete_fragments(self, inp: DeleteFragmentsInput) -> DeleteFragmentsOutput:
        return DeleteFragmentsOutput(deleted=0)

    @defn(ActivityName.DELETE_READ_MODEL)
    async def delete_read_model(self, inp: DeleteReadModelInput) -> DeleteReadModelOutput:
        return DeleteReadModelOutput(deleted=0)

    @defn(DESTROY_USER_KEY)
    async def destroy_user_key(self, inp: DestroyUserKeyInput) -> DestroyUserKeyOutput:
        return DestroyUserKeyOutput(destroyed=0)


# --- the toy shapes -------------------------------------------------------------------------


class ToyActivities:
    """The toys' two no-op steps; the second ends the round."""

    def __init__(self, ends: RoundEnds) -> None:
        self.ends = ends

    @defn(TOY_NOOP)
    async def noop(self, key: str) -> str:
        return key

    @defn(TOY_NOOP_END)
    async def noop_end(self, key: str) -> str:
        self.ends.done(key)
        return key


#: ToyWorkflow's roles: a user's parent of shape (a), of shape (b), and (a)'s round.
PARENT_CHILD, PARENT_ACTIVITIES, ROUND = "parent_child", "parent_activities", "round"


@workflow.defn
class ToyWorkflow:
    """Both toy shapes, by `role`:

    - PARENT_CHILD, shape (a): a user; takes a signal per round and runs its rounds one at a
      time, forever, each as a child of this type in role ROUND (`<parent id>/round-<n>`),
      which runs 2 no-op local activities;
    - PARENT_ACTIVITIES, shape (b): the same user loop, each round 2 ordinary no-op
      activities in this workflow.

    One workflow type for all three: the sandbox imports this module for every workflow run
    (every round of shape (a)), and each type the module declares costs that import ~0.75 ms
    (`workflow.defn`); one type keeps it near workflows/memory_round.py's (one type)."""

    def __init__(self) -> None:
        self.pending: list[int] = []
        self.rounds = 0

    @workflow.signal
    def round(self, n: int) -> None:
        self.pending.append(n)

    @workflow.run
    async def run(self, key: str, role: str) -> int:
        if role == ROUND:
            for name in (TOY_NOOP, TOY_NOOP_END):
                await workflow.execute_local_activity(
                    name, key, result_type=str, start_to_close_timeout=TOY_TIMEOUT
                )
            return 1
        while True:
            await workflow.wait_condition(lambda: bool(self.pending))
            self.pending.pop(0)
            self.rounds += 1
            if role == PARENT_CHILD:
                await workflow.execute_child_workflow(
                    ToyWorkflow.run,
                    args=[key, ROUND],
                    id=f"{workflow.info().workflow_id}/round-{self.rounds}",
                )
                continue
            for name in (TOY_NOOP, TOY_NOOP_END):
                await workflow.execute_activity(
                    name, key, result_type=str, start_to_close_timeout=TOY_TIMEOUT
                )


# --- drivers: one user's rounds, one after the other ----------------------------------------


class Driver:
    """What a shape needs to run a user's rounds and to find their histories."""

    shape: str

    async def submit(self, user: str, n: int) -> None:
        raise NotImplementedError

    def parent_id(self, user: str) -> str:
        raise NotImplementedError

    def child_ids(self, user: str, rounds: int) -> list[str]:
        return [f"{self.parent_id(user)}/round-{n}" for n in range(1, rounds + 1)]


class ProductionDriver(Driver):
    """The production client path, as benchmarks/throughput.py drives it (2 turns per round,
    urgent, the demo story's lines)."""

    def __init__(self, client: Any, shape: str = "production") -> None:
        self.client = client  # a MemoryClient
        self.shape = shape

    async def submit(self, user: str, n: int) -> None:
        from mnemoflow.devstack.demo_story import SESSION_ONE
        from mnemoflow.models.turns import ChatTurn

        # Stamped when said, as a conversation hands them over: a turn stamped ahead of the
        # workflow's clock would record a patch marker and its search-attribute upsert
        # (workflows/user_memory.py, HORIZON_AT_NOW_PATCH).
        pos, now = 2 * (n - 1), time.time()
        turns = [
            ChatTurn(
                thread_id="bench",
                position=pos,
                role="human",
                content=SESSION_ONE[(n - 1) % len(SESSION_ONE)],
                time=now - 1.0,
            ),
            ChatTurn(
                thread_id="bench",
                position=pos + 1,
                role="ai",
                content="Noted, thank you.",
                time=now,
            ),
        ]
        await self.client.submit(user, turns, urgent=True)

    def parent_id(self, user: str) -> str:
        return str(self.client.workflow_id(user))

    def child_ids(self, user: str, rounds: int) -> list[str]:
        from mnemoflow.models.ids import round_workflow_id

        return [round_workflow_id(self.parent_id(user), n) for n in range(1, rounds + 1)]


class ToyDriver(Driver):
    """Signal-with-start of the toy parent, one signal per round."""

    def __init__(self, shape: str, temporal: Any, task_queue: str) -> None:
        self.shape = shape
        self.temporal = temporal
        self.task_queue = task_queue

    async def submit(self, user: str, n: int) -> None:
        await self.temporal.start_workflow(
            ToyWorkflow.run,
            args=[user, PARENT_CHILD if self.shape == "child_local" else PARENT_ACTIVITIES],
            id=self.parent_id(user),
            task_queue=self.task_queue,
            start_signal="round",
            start_signal_args=[n],
        )

    def parent_id(self, user: str) -> str:
        return f"toy-{user}"


async def _user(driver: Driver, ends: RoundEnds, user: str, rounds: int, lat: list[float]) -> None:
    for n in range(1, rounds + 1):
        end = ends.expect(user)
        sent = time.perf_counter()
        await driver.submit(user, n)
        lat.append(await asyncio.wait_for(end, timeout=ROUND_DEADLINE_S) - sent)


# --- CPU and histories ----------------------------------------------------------------------


def _cpu_now(pids: dict[str, int]) -> float:
    from _common import process_cpu_s

    return sum(process_cpu_s(p, children=k != "worker_and_driver") for k, p in pids.items())


async def _settle(pids: dict[str, int]) -> float:
    """Wait (checking every QUIET_WINDOW_S) until our processes together use less than
    QUIET_CORES of a core over two windows in a row, at most SETTLE_MAX_S; the seconds taken."""
    t0 = time.perf_counter()
    prev, quiet = _cpu_now(pids), 0
    while time.perf_counter() - t0 < SETTLE_MAX_S:
        await asyncio.sleep(QUIET_WINDOW_S)
        now = _cpu_now(pids)
        quiet = quiet + 1 if now - prev < QUIET_CORES * QUIET_WINDOW_S else 0
        prev = now
        if quiet >= 2:
            break
    return round(time.perf_counter() - t0, 2)


async def _figures(temporal: Any, ids: list[str]) -> dict[str, int]:
    """The histories of these workflows, summed (benchmarks/throughput.py's figures)."""
    from throughput import history_figures

    gate = asyncio.Semaphore(HISTORY_FETCHES)

    async def one(workflow_id: str) -> dict[str, int]:
        async with gate:
            return history_figures(await temporal.get_workflow_handle(workflow_id).fetch_history())

    total: dict[str, int] = {"workflows": len(ids)}
    for row in await asyncio.gather(*(one(w) for w in ids)):
        for k, v in row.items():
            total[k] = total.get(k, 0) + v
    return total


async def _histories(
    temporal: Any, driver: Driver, users: list[str], rounds: int
) -> dict[str, Any]:
    parent = await _figures(temporal, [driver.parent_id(u) for u in users])
    child = (
        await _figures(temporal, [c for u in users for c in driver.child_ids(u, rounds)])
        if driver.shape != "no_child"
        else {}
    )
    total = len(users) * rounds

    def per(d: dict[str, int]) -> dict[str, float]:
        return {k: round(v / total, 2) for k, v in d.items() if k != "workflows"}

    both = {k: parent.get(k, 0) + child.get(k, 0) for k in parent if k != "workflows"}
    return {
        "parent": per(parent),
        "child": per(child),
        "total": per(both),
        "workflows_fetched": parent["workflows"] + child.get("workflows", 0),
    }


# --- one shape --------------------------------------------------------------------------------


async def _phase(
    driver: Driver, ends: RoundEnds, temporal: Any, pids: dict[str, int], users: int, rounds: int
) -> dict[str, Any]:
    from _common import process_nice, summary_ms
    from throughput import CpuMeter

    tag = uuid.uuid4().hex[:6]
    warm = [f"floor-{driver.shape}-warm-{tag}-{i}" for i in range(WARM_USERS)]
    await asyncio.gather(*(_user(driver, ends, w, 1, []) for w in warm))
    await _settle(pids)
    names = [f"floor-{driver.shape}-{tag}-{u}" for u in range(users)]
    load0 = [round(x, 2) for x in os.getloadavg()]
    counted0 = ends.count
    lat: list[float] = []
    print(f"{driver.shape}: {users} users x {rounds} rounds ...", flush=True)
    meter = CpuMeter(pids)
    await asyncio.gather(*(_user(driver, ends, n, rounds, lat) for n in names))
    usage = meter.read()
    load1 = [round(x, 2) for x in os.getloadavg()]
    drain_s = await _settle(pids)
    settled = meter.read()
    counted = ends.count - counted0
    total = users * rounds

    def per_round(cpu: dict[str, Any]) -> dict[str, float]:
        out = {k: round(1000 * v / total, 1) for k, v in cpu["cpu_s"].items()}
        out["all"] = round(1000 * cpu["cpu_s_ours"] / total, 1)
        return out

    result: dict[str, Any] = {
        "shape": driver.shape,
        "users": users,
        "rounds_per_user": rounds,
        "rounds": total,
        "rounds_ended": counted,
        "rounds_per_s": round(total / usage["wall_s"], 2),
        "submit_to_round_end": summary_ms(lat),
        **usage,
        "cpu_ms_per_round": per_round(usage),
        "settled": {
            "drain_s": drain_s,
            "wall_s": settled["wall_s"],
            "cpu_s": settled["cpu_s"],
            "cpu_s_machine": settled["cpu_s_machine"],
            "cpu_ms_per_round": per_round(settled),
        },
        "load_avg_1_5_15": {"start": load0, "end": load1},
        "nice": {k: process_nice(p) for k, p in pids.items()},
    }
    cores = os.cpu_count() or 2
    result["rounds_per_s_if_cpu_bound"] = round(
        1000 * cores / max(result["settled"]["cpu_ms_per_round"]["all"], 1e-9), 1
    )
    result["history_per_round"] = await _histories(temporal, driver, names, rounds)
    return result


# --- the stack: a dev server, a worker, the drivers ------------------------------------------


def _settings(data_dir: str, address: str) -> Any:
    """Settings as `mnemoflow dev` reads them (heuristic models; nothing of them is used),
    pointed at this run's dev server."""
    from _common import settings_from

    settings = settings_from({"MNEMOFLOW_DATA_DIR": data_dir, "MNEMOFLOW_MODELS": "heuristic"})
    temporal = settings.temporal.model_copy(update={"address": address})
    return settings.model_copy(update={"temporal": temporal})


def _split_settings(settings: Any, llm_rate: float | None) -> Any:
    """The settings of the chart's layout (benchmarks/throughput.py `start_split_workers`):
    the LLM activities on a queue of their own, rate limited (0 or None: unlimited)."""
    queue = settings.temporal.task_queue
    return settings.model_copy(
        update={
            "temporal": settings.temporal.model_copy(update={"llm_task_queue": f"{queue}-llm"}),
            "mnemoflow": settings.mnemoflow.model_copy(
                update={"llm_activities_per_second": llm_rate or None}
            ),
        }
    )


def _worker(client: Any, settings: Any, activities: list[Any], plan: Any = None) -> Any:
    """One Worker with production's arguments (worker/app.py `build_workers`; keep in step):
    the production workflows and the toys, the no-op activities. `plan` (worker/app.py
    `WorkerPlan`) names the queue and whether it runs workflows; default the dev layout's one
    Worker, which runs everything."""
    from temporalio.worker import Worker

    from mnemoflow.worker import app
    from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
    from mnemoflow.workflows.user_memory import UserMemoryWorkflow

    if plan is None:
        (plan,) = app.worker_plans(settings)
    workflows = [UserMemoryWorkflow, MemoryRoundWorkflow, ToyWorkflow] if plan.workflows else []
    limit = settings.mnemoflow.max_concurrent_activities
    options: dict[str, Any] = {}
    versioning = app.deployment_config(settings)
    if versioning is not None:
        options["deployment_config"] = versioning
    return Worker(
        client,
        task_queue=plan.task_queue,
        workflows=workflows,
        activities=activities,
        activity_executor=None,  # every no-op is async
        max_concurrent_activities=limit,
        max_concurrent_local_activities=limit,
        max_task_queue_activities_per_second=plan.activities_per_second,
        max_cached_workflows=app.MAX_CACHED_WORKFLOWS,
        workflow_runner=app.workflow_runner(),
        graceful_shutdown_timeout=timedelta(seconds=settings.mnemoflow.graceful_shutdown_s),
        **options,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import logging

    from mnemoflow.devstack import temporal_dev
    from mnemoflow.devstack.embedded import CONNECT_DEADLINE_S, CONNECT_RETRY_S
    from mnemoflow.devstack.processes import free_port
    from mnemoflow.worker import app
    from mnemoflow.worker.client import connect_until
    from mnemoflow.worker.memory_client import memory_client
    from mnemoflow.worker.search_attributes import ensure_search_attributes, wanted
    from mnemoflow.workflows import user_rounds

    shapes = [s for s in args.shapes.split(",") if s]
    unknown = set(shapes) - set(SHAPES)
    if unknown or not shapes:
        raise SystemExit(f"--shapes takes {', '.join(SHAPES)}; got {args.shapes!r}")
    llm_rate = getattr(args, "llm_rate", None)
    if llm_rate is None and "production_split" in shapes:
        from throughput import chart_llm_rate

        llm_rate = chart_llm_rate()
    # As running_worker does before it builds the Workers.
    app.single_threaded_blas()
    bytecode = app.workflow_bytecode_cache()
    phases: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mnemoflow-floor-") as tmp:
        port, ui = free_port(), free_port()
        while ui == port:
            ui = free_port()
        print(f"starting the Temporal dev server in {tmp} ...", flush=True)
        server = await asyncio.to_thread(
            temporal_dev.start_temporal_dev, port, ui, os.path.join(tmp, "temporal.db"), wanted()
        )
        try:
            settings = _settings(tmp, f"127.0.0.1:{port}")
            temporal = await connect_until(
                settings.temporal,
                asyncio.Event(),
                retry_s=CONNECT_RETRY_S,
                deadline_s=CONNECT_DEADLINE_S,
                then=ensure_search_attributes,
                log_level=logging.DEBUG,
            )
            assert temporal is not None
            ends = RoundEnds()
            acts = [
                *app.activity_methods(NoopMemoryActivities(ends)),
                *app.activity_methods(ToyActivities(ends)),
            ]
            pids = {"worker_and_driver": os.getpid(), "temporal": server.pid}
            split = _split_settings(settings, llm_rate) if "production_split" in shapes else None
            clients = {"production": memory_client(temporal, settings)}
            if split is not None:
                clients["production_split"] = memory_client(temporal, split)
            async with contextlib.AsyncExitStack() as workers:
                await workers.enter_async_context(_worker(temporal, settings, acts))
                for plan in app.worker_plans(split) if split is not None else []:
                    if not plan.workflows:  # the LLM queue's Worker (the main one runs above)
                        await workers.enter_async_context(_worker(temporal, split, acts, plan))
                for shape in shapes:
                    driver: Driver = (
                        ProductionDriver(clients[shape], shape)
                        if shape in PRODUCTION_SHAPES
                        else ToyDriver(shape, temporal, settings.temporal.task_queue)
                    )
                    phase = await _phase(driver, ends, temporal, pids, args.users, args.rounds)
                    if shape in PRODUCTION_SHAPES:
                        phase["round_shape"] = user_rounds.ROUND_SHAPE
                    if shape == "production_split":
                        phase["llm_activities_per_second"] = llm_rate
                    phases.append(phase)
                    h = phase["history_per_round"]["total"]
                    print(
                        f"  {phase['rounds_per_s']} rounds/s, "
                        f"{phase['settled']['cpu_ms_per_round']['all']} CPU-ms/round, "
                        f"{h['events']} events, {h['workflow_tasks']} workflow tasks per round",
                        flush=True,
                    )
            for client in clients.values():
                await client.aclose()
        finally:
            await asyncio.to_thread(server.stop, 15.0)
    production = next((p for p in phases if p["shape"] == "production"), None)
    return {
        "phases": phases,
        "order": shapes,
        "round_shape": user_rounds.ROUND_SHAPE,
        "server_pid": server.pid,
        "sqlite_pragmas": dict(temporal_dev.SQLITE_PRAGMAS),
        "worker": {
            "max_cached_workflows": app.MAX_CACHED_WORKFLOWS,
            "max_concurrent_activities": settings.mnemoflow.max_concurrent_activities,
            "workflow_runner": "sandboxed, "
            + ", ".join((app.PASSED_THROUGH, *app.FINALIZERS_PASSED_THROUGH))
            + " passed through",
            "bytecode_cache": bytecode,
            "interceptors": "none (as mnemoflow dev)",
        },
        "targets": {
            "rounds_per_s": TARGET_ROUNDS_PER_S,
            "cpu_ms_per_round": TARGET_CPU_MS_PER_ROUND,
        },
        "production_floor_meets_targets": None
        if production is None
        else {
            "rounds_per_s": production["rounds_per_s"] >= TARGET_ROUNDS_PER_S,
            "cpu_ms_per_round": production["settled"]["cpu_ms_per_round"]["all"]
            <= TARGET_CPU_MS_PER_ROUND,
        },
    }


def table(result: dict[str, Any]) -> str:
    """The phases as a compact text table."""
    head = (
        f"{'shape':<22} {'rounds/s':>8} {'CPU-ms/round srv+bench=all':>27} {'settled all':>11} "
        f"{'events':>7} {'wf tasks':>8} {'bytes':>7} {'machine':>7} {'load start->end':>16}"
    )
    lines = [head, "-" * len(head)]
    for p in result["phases"]:
        c, s, h = p["cpu_ms_per_round"], p["settled"]["cpu_ms_per_round"], p["history_per_round"]
        t = h["total"]
        name = p["shape"] + (f" ({p['round_shape']})" if "round_shape" in p else "")
        cpu = f"{c['temporal']:.1f}+{c['worker_and_driver']:.1f}={c['all']:.1f}"
        load = f"{p['load_avg_1_5_15']['start'][0]:.2f}->{p['load_avg_1_5_15']['end'][0]:.2f}"
        lines.append(
            f"{name:<22} {p['rounds_per_s']:>8.2f} {cpu:>27} {s['all']:>11.1f} "
            f"{t['events']:>7.2f} {t['workflow_tasks']:>8.2f} {t['bytes']:>7.0f} "
            f"{p['utilisation_machine']:>7.0%} {load:>16}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--users", type=int, default=0, help="users per shape (default 100)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds per user (default 10)")
    parser.add_argument("--short", action="store_true", help="20 users x 3 rounds per shape")
    parser.add_argument(
        "--shapes",
        default=",".join(DEFAULT_SHAPES),
        help="measured in this order, on one dev server: " + ", ".join(SHAPES),
    )
    parser.add_argument(
        "--llm-rate",
        type=float,
        default=None,
        help="production_split: LLM activities per second (default: the chart's; 0: unlimited)",
    )
    args = parser.parse_args()
    args.users = args.users or (20 if args.short else 100)
    args.rounds = args.rounds or (3 if args.short else 10)
    from _common import write_result

    result = asyncio.run(run(args))
    print(table(result))
    for p in result["phases"]:
        h = p["history_per_round"]
        print(
            f"{p['shape']}: {p['rounds_ended']}/{p['rounds']} rounds ended; per round parent "
            f"{h['parent'].get('events', 0)} events / {h['parent'].get('workflow_tasks', 0)} "
            f"tasks, child {h['child'].get('events', 0)} / {h['child'].get('workflow_tasks', 0)}; "
            f"machine busy {p['cpu_s_machine']} CPU-s ({p['cpu_s_others']} others) in "
            f"{p['wall_s']} s; drain {p['settled']['drain_s']} s; nice {p['nice']}"
        )
    write_result("round_floor", result, args)
    return 0


if __name__ == "__main__":
    # Everything runs from the module imported by name, so that the toy workflows the sandbox
    # imports for every run are this file's module ("round_floor", from bytecode once the
    # worker's cache is set) and not `__main__` (compiled from source each time).
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import round_floor

    raise SystemExit(round_floor.main())
