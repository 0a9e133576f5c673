"""The one worker wiring: components + settings -> the Workers of this process.

Every way a worker runs goes through `running_worker`: `mnemoflow worker` (worker.serve), the dev
stack and the demo (devstack.embedded) and the tests (tests/support). What differs between them
is only the `Components` handed in (tests inject offline models, hashing embeddings or a slowed
store) and the settings (queues, role, versioning); whatever is not handed in is built from the
settings and closed on the way out.

Queues and roles (`worker_plans`): one Worker per task queue per process, because the SDK refuses
two Workers of one client on the same queue. Without TEMPORAL_LLM_TASK_QUEUE (or with it equal to
the main queue) one Worker runs everything. With a separate LLM queue, MNEMOFLOW_WORKER_ROLE picks
"workflow" (workflows + Milvus/Redis activities on the main queue), "llm" (the LLM activities on
their queue, rate limited queue-wide) or "all" (both Workers in this process).

Local activities run on the Worker of the workflow that calls them. A round's store step is one
(the store activities are on the workflow side in every layout). A round's LLM steps try once
locally only when the LLM activities share the workflow's queue, that is, on the one Worker that
runs everything; with an LLM queue of their own they always go through it, so its queue-wide
rate limit and the LLM role hold (docs/ARCHITECTURE.md, "The round"). Local activities take
their own slots: as many as ordinary ones (`max_concurrent_activities`).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import Worker, WorkerDeploymentConfig
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from mnemoflow.worker.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class Components:
    """What a worker is built from; a part left None is built from the settings."""

    models: Any = None
    embeddings: Any = None
    store: Any = None
    read_model: Any = None


@dataclass
class WorkerResources:
    """A built worker: its Workers, the components they use and what this run must close."""

    store: Any
    read_model: Any
    models: Any
    embeddings: Any
    workers: list[Worker] = field(default_factory=list)
    owned: list[Any] = field(default_factory=list)
    executors: list[ThreadPoolExecutor] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close what this run built (errors logged, not raised); parts handed in are the
        caller's to close."""
        for resource in self.owned:
            await _close(resource)
        for executor in self.executors:
            executor.shutdown(wait=False, cancel_futures=True)


async def _close(resource: Any) -> None:
    # Stores close with `close`, models with `aclose`; either may be sync or async.
    for name in ("aclose", "close"):
        method = getattr(resource, name, None)
        if method is None:
            continue
        try:
            result = method()
            if inspect.isawaitable(result):
                await result
        except Exception:  # closing must not hide the reason we are shutting down
            log.exception("closing %s failed", type(resource).__name__)
        return


def activity_methods(obj: Any) -> list[Callable[..., Any]]:
    """The bound `@activity.defn` methods of an activity object, by name for a stable order."""
    found = []
    for name in sorted(dir(obj)):
        if name.startswith("_"):
            continue
        member = getattr(obj, name)
        if callable(member) and hasattr(member, "__temporal_activity_definition"):
            found.append(member)
    return found


def default_models(settings: Settings) -> Any:
    """The memory models the settings select (DeepSeek or the offline heuristic ones)."""
    if settings.resolved_models() == "deepseek":
        from mnemoflow.activities.llm.deepseek import deepseek_chat_model
        from mnemoflow.activities.llm.langchain_models import LangChainMemoryModels

        ds = settings.deepseek
        assert ds.api_key is not None  # resolved_models() checked it
        chat = deepseek_chat_model(
            api_key=ds.api_key.get_secret_value(),
            base_url=ds.base_url,
            model=ds.model,
            timeout=ds.timeout_s,
        )
        return LangChainMemoryModels(chat)
    from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels

    return HeuristicMemoryModels(latency_s=settings.mnemoflow.heuristic_latency_s)


def default_embeddings(settings: Settings) -> Any:
    """The embedder the settings select."""
    from mnemoflow.activities.embeddings import (
        HashingEmbeddings,
        UniversalSentenceEncoderEmbeddings,
    )

    if settings.milvus.embedding == "hashing":
        return HashingEmbeddings()
    return UniversalSentenceEncoderEmbeddings()


def resolve(settings: Settings, given: Components) -> WorkerResources:
    """The components, with every missing part built from the settings (and owned)."""
    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.activities.read_model import ReadModel
    from mnemoflow.activities.store_epochs import StoreEpochs

    owned: list[Any] = []
    models = given.models
    if models is None:
        models = default_models(settings)
        owned.append(models)
    embeddings = given.embeddings or default_embeddings(settings)
    store = given.store
    if store is None:
        token = settings.milvus.token.get_secret_value() if settings.milvus.token else None
        m = settings.milvus
        store = FragmentStore(
            m.uri,
            embeddings,
            collection=m.collection,
            token=token,
            flush_rows=m.flush_rows,
            lines=True,
        )
        owned.append(store)
    read_model = given.read_model
    if read_model is None:
        read_model = ReadModel(settings.redis.url, settings.redis.key_prefix)
        owned.append(read_model)
    if isinstance(store, FragmentStore) and store.epochs is None:
        # Every store write is checked against the user's forget epoch (docs/ARCHITECTURE.md,
        # "Forget epochs"), in the read model's Redis, where agents read the epoch too.
        epochs = StoreEpochs(settings.redis.url, read_model.prefix)
        store.use_epochs(epochs)
        owned.append(epochs)
    return WorkerResources(store, read_model, models, embeddings, owned=owned)


@dataclass(frozen=True)
class WorkerPlan:
    """One Worker of this process: its queue and what it runs."""

    task_queue: str
    workflows: bool
    store_activities: bool
    llm_activities: bool
    activities_per_second: float | None = None


def worker_plans(settings: Settings) -> list[WorkerPlan]:
    """The Workers this process runs, by queues and MNEMOFLOW_WORKER_ROLE (one per queue)."""
    main = settings.temporal.task_queue
    llm = settings.temporal.llm_task_queue
    role = settings.mnemoflow.worker_role
    rate = settings.mnemoflow.llm_activities_per_second
    if llm is None or llm == main:
        if role != "all":
            raise ValueError(
                f"MNEMOFLOW_WORKER_ROLE={role} needs TEMPORAL_LLM_TASK_QUEUE set to a queue other "
                "than TEMPORAL_TASK_QUEUE"
            )
        if rate is not None:
            log.warning("LLM rate limit ignored: the LLM activities share the main task queue")
        return [WorkerPlan(main, workflows=True, store_activities=True, llm_activities=True)]
    plans = []
    if role in ("all", "workflow"):
        plans.append(WorkerPlan(main, workflows=True, store_activities=True, llm_activities=False))
    if role in ("all", "llm"):
        plans.append(WorkerPlan(llm, False, False, llm_activities=True, activities_per_second=rate))
    return plans


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """Worker Versioning options, or None when MNEMOFLOW_DEPLOYMENT_NAME is unset.

    Default behaviour AUTO_UPGRADE: a user workflow is a long-lived entity workflow that
    continues as new and never completes, so pinning it would keep every old version running
    for as long as its users do; it moves to the current version at its next workflow task,
    which is safe because workflow changes go through `workflow.patched` and the committed
    replay histories (tests/replay). Rounds are short, but they are children of the user
    workflow and read the same contracts, so they follow the same rule instead of pinning.
    """
    m = settings.mnemoflow
    if m.deployment_name is None:
        return None
    assert m.build_id is not None  # MnemoflowSettings requires both
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(deployment_name=m.deployment_name, build_id=m.build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.AUTO_UPGRADE,
    )


def user_key_activities(settings: Settings, res: WorkerResources, client: Client) -> Any:
    """The forget saga's `destroy_user_key`, on the Redis of the per-user data keys (the read
    model's client when it is the same Redis), dropping this process's cached copies of a
    destroyed key at once (docs/PRIVACY.md)."""
    from mnemoflow.activities.user_keys import UserKeyActivities

    enc = settings.temporal.encryption
    if not enc.data_keys_on or enc.data_keys_url is None:
        return UserKeyActivities(None)
    url, prefix = enc.data_keys_url.get_secret_value(), enc.data_keys_prefix or "mnemoflow:"
    store = getattr(client.data_converter.payload_codec, "store", None)
    forget_cached = getattr(store, "forget_cached", None)
    if url == settings.redis.url:
        return UserKeyActivities(res.read_model.redis, prefix, forget_cached)
    keys = UserKeyActivities.from_url(url, prefix, forget_cached)
    res.owned.append(keys)
    return keys


#: Workflows kept in memory per worker (the SDK's default). An evicted user workflow is
#: replayed from its history on its next task; docs/CAPACITY.md sizes this for active users.
MAX_CACHED_WORKFLOWS = 1000


#: The package whose modules the workflow sandbox takes from this process instead of importing
#: them afresh for every workflow run (`workflow_runner`).
PASSED_THROUGH = "mnemoflow"
#: Packages no workflow imports, passed through too: their objects live in the worker process
#: (the activities' clients) and a finalizer of theirs imports, so a garbage collection that
#: lands in a workflow activation (it runs on that thread, with the sandbox's importer in
#: place) would import the module afresh inside the sandbox. Measured: redis-py's
#: `ConnectionPool.__del__` imports `redis.observability.recorder`, which brought redis's
#: modules, OpenTelemetry's (reading `os.environ`, which the sandbox restricts: "get on
#: os.environ restricted" in the log) and `cryptography` into a run's namespace, through
#: importlib's module locks, where Python 3.11 can fail a nested import
#: (`no_collection_while_validating`). Passed through, such an import is the module this
#: process already holds (`tests/worker/test_workflow_runner.py`).
FINALIZERS_PASSED_THROUGH = ("redis", "hiredis")
#: What those finalizers import (`workflow_runner` loads it before any Worker runs).
FINALIZER_IMPORTS = ("redis.observability.recorder",)


def workflow_runner() -> SandboxedWorkflowRunner:
    """The SDK's sandbox, with this package's modules passed through (and the packages whose
    finalizers import, FINALIZERS_PASSED_THROUGH).

    The sandbox imports a workflow's module afresh for every workflow run it starts, and every
    round is a run: `workflows/memory_round.py` and `workflows/user_memory.py` were executed
    again, in a new sandbox namespace, for each one (docs/PERFORMANCE.md, "The workflow
    sandbox"). Their helpers (`workflows/state_ops.py`, `user_rounds.py`, ...) and the models
    were passed through already, by `workflow.unsafe.imports_passed_through`; now the two
    workflow modules are too, so a run reuses the modules this process imported once. What the
    sandbox still does for every run: its own namespace for the workflow instance, the
    restricted standard library for anything imported inside it, and its checks of the
    workflow's calls. What it no longer does for our modules: give each run fresh module
    globals. Those modules hold constants only, and the replay tests run the same workflows in
    the SDK's default sandbox, where nothing is passed through (`tests/support/replay.py`).
    """
    # The module redis-py's pool finalizer imports, loaded once here: passed through, that
    # import in a workflow thread then finds it loaded and takes no module lock.
    for name in FINALIZER_IMPORTS:
        try:
            importlib.import_module(name)
        except ImportError:  # a redis-py without it: its finalizer imports nothing either
            pass
    restrictions = SandboxRestrictions.default.with_passthrough_modules(
        PASSED_THROUGH, *FINALIZERS_PASSED_THROUGH
    )
    return SandboxedWorkflowRunner(restrictions=restrictions)


def build_workers(client: Client, settings: Settings, res: WorkerResources) -> list[Worker]:
    """The Workers of `worker_plans`, their activities bound to the resolved components.

    Built with the automatic garbage collection held off (`no_collection_while_validating`):
    the modules imported here on the first call, and each Worker's validation of its workflows
    in the sandbox, take module locks that a collection's importing finalizer must not enter.
    """
    with no_collection_while_validating():
        return _build_workers(client, settings, res)


def _build_workers(client: Client, settings: Settings, res: WorkerResources) -> list[Worker]:
    from mnemoflow.activities.fragments import FragmentActivities
    from mnemoflow.activities.llm_activities import LLMActivities
    from mnemoflow.activities.read_model import ReadModelActivities
    from mnemoflow.activities.round_store import RoundStoreActivities
    from mnemoflow.activities.search_corpus import SearchCorpus
    from mnemoflow.activities.theme_weights import ThemeWeights
    from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
    from mnemoflow.workflows.user_memory import UserMemoryWorkflow

    # The users' corpus versions and shape 5's tuned weights share the read model's Redis
    # client (closed with it).
    corpus = SearchCorpus(res.read_model.redis, res.read_model.prefix)
    themes = ThemeWeights(res.read_model.redis, res.read_model.prefix)
    store_acts = [
        *activity_methods(FragmentActivities(res.store, corpus)),
        *activity_methods(ReadModelActivities(res.read_model, res.store)),
        *activity_methods(user_key_activities(settings, res, client)),
        # The lean round's store step, run as a local activity by the round (workflow side).
        *activity_methods(RoundStoreActivities(res.store, res.read_model, corpus, themes)),
    ]
    llm_acts = activity_methods(LLMActivities(res.models, fragments=res.store, themes=themes))
    limit = settings.mnemoflow.max_concurrent_activities
    versioning = deployment_config(settings)
    workers = []
    for plan in worker_plans(settings):
        acts = (store_acts if plan.store_activities else []) + (
            llm_acts if plan.llm_activities else []
        )
        # Async activities run on the event loop; a thread pool only for plain functions (the
        # SDK refuses those without one).
        executor = None
        if any(not inspect.iscoroutinefunction(a) for a in acts):
            executor = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="activity")
            res.executors.append(executor)
        options: dict[str, Any] = {}
        if versioning is not None:
            options["deployment_config"] = versioning
        workers.append(
            Worker(
                client,
                task_queue=plan.task_queue,
                workflows=[UserMemoryWorkflow, MemoryRoundWorkflow] if plan.workflows else [],
                activities=acts,
                activity_executor=executor,
                max_concurrent_activities=limit,
                max_concurrent_local_activities=limit,
                max_task_queue_activities_per_second=plan.activities_per_second,
                max_cached_workflows=MAX_CACHED_WORKFLOWS,
                workflow_runner=workflow_runner(),
                graceful_shutdown_timeout=timedelta(seconds=settings.mnemoflow.graceful_shutdown_s),
                **options,
            )
        )
    return workers


_gc_guard = threading.Lock()
_gc_holders = 0  # guarded by _gc_guard
_gc_was_enabled = False  # guarded by _gc_guard: gc.isenabled() when the first holder came


@contextmanager
def no_collection_while_validating() -> Iterator[None]:
    """No automatic cyclic garbage collection for the duration of the block (`build_workers`).

    Constructing a Worker validates each workflow by importing its module afresh in the
    workflow sandbox, through pure-Python `importlib`, which takes a module lock per module
    (so does any first import of a module). On Python 3.11 that lock's `acquire` is not
    re-entrant on one thread: a nested import that takes a module lock inside its window makes
    the outer one end in `KeyError(<thread id>)`, and the Worker in `RuntimeError: Failed
    validating workflow`. A collection landing there runs finalizers on this thread, inside the
    sandbox, and some import: redis-py's `ConnectionPool.__del__` imports a module for every
    pool a closed client leaves behind (each of our Redis clients, once it has connected), a
    module the sandbox has not loaded. Nothing is lost by deferring the collection for as long
    as a construction takes; it runs after, outside the sandbox
    (docs/ARCHITECTURE.md, "The worker process and its roles"). Holders nest and may come from
    several threads: the last one out switches the collector back on, if it was on before.
    """
    global _gc_holders, _gc_was_enabled
    with _gc_guard:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        with _gc_guard:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()


def single_threaded_blas() -> None:
    """One BLAS thread for the whole process (numpy's OpenBLAS starts one per core).

    The worker's numpy work is small (a few embeddings, a few hundred cosines per call), which a
    second thread does not speed up; but after each parallel call an idle OpenBLAS thread
    busy-waits. Measured on 2 cores (benchmarks/throughput.py): that spinning took ~40% of the
    worker's CPU and halved the rounds per second.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


#: The bytecode directory `workflow_bytecode_cache` chose for this process, once.
_bytecode_dir: str | None = None


def bytecode_cache_dir() -> Path:
    """The user's cache for our bytecode: `$XDG_CACHE_HOME/mnemoflow/bytecode`, by default
    under `~/.cache` (pip's and most tools' place; delete it any time)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mnemoflow" / "bytecode"


def _current_pyc(source: str) -> bool:
    """Whether a `.pyc` beside `source` is valid for it (as the import system checks it)."""
    try:
        with open(importlib.util.cache_from_source(source), "rb") as f:
            head = f.read(16)
        st = os.stat(source)
    except OSError:
        return False
    if len(head) < 16 or head[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(head[4:8], "little") & 1:  # hash-based: checked at import, by hash
        return True
    mtime, size = (int.from_bytes(head[i : i + 4], "little") for i in (8, 12))
    return mtime == int(st.st_mtime) & 0xFFFFFFFF and size == st.st_size & 0xFFFFFFFF


def workflow_bytecode_cache(probe: str | None = None, cache_dir: Path | None = None) -> str | None:
    """Let the workflow sandbox load our modules from bytecode instead of compiling them.

    The SDK's default sandbox imports a workflow's module afresh for every workflow run it
    starts, and a round is a run of its own. With PYTHONDONTWRITEBYTECODE set (this machine's
    environment, the Docker build) and an editable install (`make venv`, `mnemoflow dev`) no
    `.pyc` exists, so every round compiled `workflows/memory_round.py` from source again: ~6 ms
    of CPU per round, the module alone (docs/PERFORMANCE.md, section 2). The Workers now pass
    the package through (`workflow_runner`), so they import it once per process; the cache
    still spares that import its compile in every new process, and serves the sandboxes that
    pass nothing through (`mnemoflow replay`, the replay tests). When Python may
    not write bytecode, this process writes it to the user's cache (`bytecode_cache_dir`, mode
    0700, owned by the user or not used) and reads it from there; nothing is written next to
    the sources. A cache, not a temp dir: `mnemoflow` commands end with `os._exit`, so nothing
    at exit could remove a per-process directory (35 MB each), and the next process finds its
    bytecode ready. A process that writes bytecode already, that chose a `sys.pycache_prefix`
    itself, or whose workflow modules were compiled at install (`probe`, by default the round
    workflow's module, has a current `.pyc` beside it: a wheel installed by pip, the Docker
    image) is left as it is. Returns the directory in use (None: Python's own behaviour).
    """
    global _bytecode_dir
    if _bytecode_dir is not None or not sys.dont_write_bytecode or sys.pycache_prefix:
        return _bytecode_dir
    if probe is None:  # found, not imported: its first import should write the cache
        spec = importlib.util.find_spec("mnemoflow.workflows.memory_round")
        probe = spec.origin if spec is not None else None
    if probe and _current_pyc(probe):
        return None
    path = cache_dir or bytecode_cache_dir()
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = path.stat()
    except OSError as exc:  # no writable cache: compiling every time is slower, not wrong
        log.warning("no bytecode cache for the workflow sandbox: %s", exc)
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        # Bytecode is code: never read it from a directory someone else could write to.
        log.warning("bytecode cache %s is not the user's own (mode 0700): not used", path)
        return None
    sys.pycache_prefix = str(path)
    sys.dont_write_bytecode = False
    _bytecode_dir = str(path)
    return _bytecode_dir


@asynccontextmanager
async def running_worker(
    client: Client, settings: Settings, components: Components | None = None
) -> AsyncIterator[WorkerResources]:
    """Run this process's Workers for the duration of the block, then shut down gracefully.

    The Milvus collection is ensured before polling starts, so the first index activity does
    not race schema creation; what this run built is closed after the Workers have stopped.
    """
    single_threaded_blas()
    workflow_bytecode_cache()
    res = resolve(settings, components or Components())
    async with AsyncExitStack() as stack:
        stack.push_async_callback(res.aclose)
        res.workers = build_workers(client, settings, res)
        await res.store.ensure()
        if getattr(res.store, "lines_created", False):
            migration = asyncio.create_task(migrate_to_lines(res))
            stack.callback(migration.cancel)
        for each in res.workers:
            await stack.enter_async_context(each)
        yield res


async def migrate_to_lines(res: WorkerResources) -> None:
    """Once, by the worker that created the line collection: the line rows of the fragments
    stored before it (`activities/line_backfill.py`), then the line collections older versions
    kept dropped (`FragmentStore.drop_earlier_lines`) and the fragment copies an older
    version kept in Redis deleted (`activities/search_corpus.py`). In the background: the
    worker serves rounds meanwhile. `mnemoflow backfill-lines` does the same on demand."""
    from mnemoflow.activities.line_backfill import backfill_lines
    from mnemoflow.activities.search_corpus import drop_copies

    try:
        report = await backfill_lines(res.store)
        log.info("line rows backfilled: %s", report.as_dict())
        if not report.unsettled:
            dropped = await res.store.drop_earlier_lines()
            log.info("earlier line collections dropped: %s", dropped)
        dropped = await drop_copies(res.read_model.redis, res.read_model.prefix)
        log.info("fragment copies deleted from Redis: %d", dropped)
    except asyncio.CancelledError:
        raise
    except Exception as err:  # the worker goes on; the command can finish it
        log.warning("line backfill stopped (run `mnemoflow backfill-lines`): %r", err)
