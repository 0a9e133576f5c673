"""Worker wiring: both workflows and every activity, on one task queue or two.

`build_worker` creates the stores and activity objects from settings (or takes injected models
and embeddings, which tests and the demo use) and returns the Worker plus the resources it
owns. `running_worker` is the usual way in: it also ensures the Milvus collection before
polling and closes the Redis and Milvus clients on the way out.

When `TEMPORAL_LLM_TASK_QUEUE` is set, the LLM activities (slice, tune, induct) get a Worker
of their own on that queue, so LLM capacity can scale separately from store I/O.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker

from mnemoflow.worker.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class WorkerResources:
    """What a worker run owns: the Workers, the store clients and the activity objects."""

    worker: Worker
    store: Any
    read_model: Any
    models: Any
    embeddings: Any
    activity_objects: list[Any] = field(default_factory=list)
    llm_worker: Worker | None = None
    executors: list[ThreadPoolExecutor] = field(default_factory=list)
    owns_models: bool = False

    @property
    def workers(self) -> list[Worker]:
        """Every Worker to run (the LLM one only when a separate queue is configured)."""
        return [w for w in (self.worker, self.llm_worker) if w is not None]

    async def aclose(self) -> None:
        """Close the Redis and Milvus clients, the memory models when this run built them
        (errors logged, not raised), and any executor."""
        owned = [self.models] if self.owns_models else []
        for resource in (self.read_model, self.store, *owned):
            await _close(resource)
        for executor in self.executors:
            executor.shutdown(wait=False, cancel_futures=True)


async def _close(resource: Any) -> None:
    # The store modules are written in parallel; accept either close spelling, sync or async.
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


def _new_worker(
    client: Client,
    settings: Settings,
    task_queue: str,
    *,
    workflows: list[type],
    acts: list[Any],
    executors: list[ThreadPoolExecutor],
) -> Worker:
    # Async activities run on the event loop and need no executor; a thread pool is only
    # created if some activity is a plain function (the SDK refuses those without one).
    limit = settings.mnemoflow.max_concurrent_activities
    executor = None
    if any(not inspect.iscoroutinefunction(a) for a in acts):
        executor = ThreadPoolExecutor(max_workers=limit, thread_name_prefix="activity")
        executors.append(executor)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=workflows,
        activities=acts,
        activity_executor=executor,
        max_concurrent_activities=limit,
        graceful_shutdown_timeout=timedelta(seconds=settings.mnemoflow.graceful_shutdown_s),
    )


def build_worker(
    client: Client,
    settings: Settings,
    *,
    models: Any = None,
    embeddings: Any = None,
    task_queue: str | None = None,
) -> tuple[Worker, WorkerResources]:
    """The main Worker (workflows + activities) and the resources it owns.

    The LLM activities join the main Worker unless `settings.temporal.llm_task_queue` is set;
    then they run on `resources.llm_worker`.
    """
    from mnemoflow.activities.fragment_store import FragmentStore
    from mnemoflow.activities.fragments import FragmentActivities
    from mnemoflow.activities.llm_activities import LLMActivities
    from mnemoflow.activities.read_model import ReadModel, ReadModelActivities
    from mnemoflow.activities.search_corpus import SearchCorpus
    from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
    from mnemoflow.workflows.user_memory import UserMemoryWorkflow

    owns_models = models is None
    models = models if models is not None else default_models(settings)
    embeddings = embeddings if embeddings is not None else default_embeddings(settings)
    token = settings.milvus.token.get_secret_value() if settings.milvus.token else None
    store = FragmentStore(
        settings.milvus.uri, embeddings, collection=settings.milvus.collection, token=token
    )
    read_model = ReadModel(settings.redis.url, settings.redis.key_prefix)
    corpus = SearchCorpus(read_model.redis, settings.redis.key_prefix)
    store_objects = [FragmentActivities(store, corpus), ReadModelActivities(read_model)]
    llm_object = LLMActivities(models, fragments=store)

    queue = task_queue or settings.temporal.task_queue
    llm_queue = settings.temporal.llm_task_queue
    store_acts = _flatten(activity_methods(o) for o in store_objects)
    llm_acts = activity_methods(llm_object)
    separate = llm_queue is not None and llm_queue != queue
    executors: list[ThreadPoolExecutor] = []
    main = _new_worker(
        client,
        settings,
        queue,
        workflows=[UserMemoryWorkflow, MemoryRoundWorkflow],
        acts=store_acts if separate else store_acts + llm_acts,
        executors=executors,
    )
    llm_worker = None
    if llm_queue is not None and separate:
        llm_worker = _new_worker(
            client, settings, llm_queue, workflows=[], acts=llm_acts, executors=executors
        )
    resources = WorkerResources(
        worker=main,
        store=store,
        read_model=read_model,
        models=models,
        embeddings=embeddings,
        activity_objects=[*store_objects, llm_object],
        llm_worker=llm_worker,
        executors=executors,
        owns_models=owns_models,
    )
    return main, resources


def _flatten(groups: Iterable[list[Any]]) -> list[Any]:
    return [item for group in groups for item in group]


def single_threaded_blas() -> None:
    """One BLAS thread for the whole process (numpy's OpenBLAS starts one per core).

    The worker's numpy work is small (a few embeddings, a few hundred cosines per call), which a
    second thread does not speed up; but after each parallel call an idle OpenBLAS thread
    busy-waits. Measured on 2 cores (benchmarks/throughput.py): that spinning took ~40% of the
    worker's CPU and halved the rounds per second.
    """
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")


@asynccontextmanager
async def running_worker(
    client: Client,
    settings: Settings,
    *,
    models: Any = None,
    embeddings: Any = None,
    task_queue: str | None = None,
) -> AsyncIterator[WorkerResources]:
    """Run the worker(s) for the duration of the block, then shut down gracefully.

    The Milvus collection is ensured before polling starts, so the first index activity does
    not race schema creation; the store clients are closed after the workers have stopped.
    """
    single_threaded_blas()
    _, resources = build_worker(
        client, settings, models=models, embeddings=embeddings, task_queue=task_queue
    )
    async with AsyncExitStack() as stack:
        stack.push_async_callback(resources.aclose)
        await resources.store.ensure()
        for each in resources.workers:
            await stack.enter_async_context(each)
        yield resources
