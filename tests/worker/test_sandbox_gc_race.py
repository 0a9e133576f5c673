"""Workers are built even when a garbage collection lands inside the sandbox's module locks.

Constructing a Worker imports each workflow's module afresh in the SDK's sandbox; on Python
3.11 a module lock is not re-entrant on one thread, and a finalizer that imports, run by a
collection inside that lock, ended the construction in `RuntimeError: Failed validating
workflow` caused by `KeyError: <thread id>` (docs/ARCHITECTURE.md, "The worker process and its
roles"). In the suite the finalizer was redis-py's `ConnectionPool.__del__`, which imports a
module for each pool a closed client leaves behind; here a finalizer imports at nearly every
allocation, so the race is met at every construction instead of once per few full runs.
"""

from __future__ import annotations

import gc
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import temporalio.workflow
from temporalio.testing import WorkflowEnvironment
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.worker.app import (
    Components,
    build_workers,
    no_collection_while_validating,
    resolve,
)
from mnemoflow.worker.settings import Settings
from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
from mnemoflow.workflows.user_memory import UserMemoryWorkflow
from tests.support.memory_worker import worker_settings


@contextmanager
def importing_finalizers() -> Iterator[list[int]]:
    """Garbage always pending whose finalizer imports, and a collection at nearly every
    allocation, for the duration of the block; yields [finalizer runs]. The import is of a
    module that is never found (an optional dependency's lazy import), so every attempt takes
    its module lock, as a sandbox's first import of a module does."""
    runs = [0]
    armed = [True]

    class Garbage:
        def __init__(self) -> None:
            self.cycle = self  # only the cyclic collector frees it

        def __del__(self) -> None:
            if not armed[0]:
                return
            runs[0] += 1
            Garbage()  # the next one, pending at once
            try:
                import mnemoflow_optional_extra  # type: ignore[import-not-found]  # noqa: F401
            except ImportError:
                pass

    threshold = gc.get_threshold()
    Garbage()
    gc.set_threshold(1)
    try:
        yield runs
    finally:
        armed[0] = False
        gc.set_threshold(*threshold)
        gc.collect()


def test_the_collector_is_held_off_until_the_last_holder_leaves() -> None:
    assert gc.isenabled()
    with no_collection_while_validating():
        assert not gc.isenabled()
        with no_collection_while_validating():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with no_collection_while_validating():
            pass
        assert not gc.isenabled(), "switched on a collector that was off"
    finally:
        gc.enable()


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 made module locks re-entrant")
async def test_the_sandbox_alone_fails_under_importing_finalizers() -> None:
    """The hazard is real: the SDK's own validation, unguarded, fails with the flake's
    signature (so the test below passes because of the guard, not by luck)."""
    defn = temporalio.workflow._Definition.must_from_class(UserMemoryWorkflow)
    with importing_finalizers() as runs, pytest.raises(Exception) as caught:
        SandboxedWorkflowRunner().prepare_workflow(defn)
    chain = []
    err: BaseException | None = caught.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    assert any(isinstance(e, KeyError) for e in chain), chain
    assert runs[0] > 0


def fresh(tag: str) -> Settings:
    """A worker's settings on a queue of its own; Milvus and Redis are never reached (the
    Workers only poll Temporal here)."""
    return worker_settings(
        task_queue=f"tq-gc-{tag}",
        milvus_uri="http://127.0.0.1:1",
        collection=f"t_{tag}",
        redis_url="redis://127.0.0.1:1/0",
        key_prefix=f"test:{tag}:",
    )


async def test_workers_are_built_while_finalizers_import(dev_env: WorkflowEnvironment) -> None:
    res = resolve(fresh("res"), Components(HeuristicMemoryModels(), HashingEmbeddings()))
    try:
        for _ in range(2):
            settings = fresh(uuid.uuid4().hex[:10])
            with importing_finalizers() as runs:
                workers = build_workers(dev_env.client, settings, res)
            assert runs[0] > 0, "no finalizer ran: the race was not set up"
            assert gc.isenabled()
            [worker] = workers
            assert {UserMemoryWorkflow.__name__, MemoryRoundWorkflow.__name__} <= set(
                worker._workflow_worker._workflows  # type: ignore[union-attr]
            )
            async with worker:  # it starts (a failed start raises on the way out) and stops
                pass
    finally:
        await res.aclose()


def test_the_redis_pool_finalizers_import_is_loaded_with_the_worker() -> None:
    """redis-py's pool finalizer imports `redis.observability.recorder`; the worker's Redis
    module loads it, so that finalizer takes no module lock inside a workflow run's sandbox."""
    import mnemoflow.activities.read_model  # noqa: F401

    assert "redis.observability.recorder" in sys.modules
