"""The Workers' workflow runner: the SDK's sandbox with this package passed through
(worker/app.py, `workflow_runner`; docs/PERFORMANCE.md, "The workflow sandbox").

The sandbox prepares a run for every workflow run it starts, and every round is a run. With the
SDK's defaults each preparation executes the workflow modules again (their code, in a new
namespace); with this package passed through it executes none of our code. Counted in a
subprocess of its own (an audit hook stays for the life of a process): the `exec` audit event
fires for each module body the import system runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.worker.app import PASSED_THROUGH, Components, build_workers, resolve
from tests.support.memory_worker import worker_settings

ROOT = Path(__file__).resolve().parents[2]

# Prepares both workflows three times with the named runner, counting the module bodies of
# ours that ran meanwhile (by file).
PROBE = r"""
import asyncio, json, sys
from collections import Counter

ran = Counter()
counting = False


def hook(event, args):
    if counting and event == "exec" and args and hasattr(args[0], "co_filename"):
        code = args[0]
        if code.co_name == "<module>" and "/mnemoflow/" in code.co_filename.replace("\\", "/"):
            ran[code.co_filename.rsplit("/", 1)[-1]] += 1


sys.addaudithook(hook)
import temporalio.workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mnemoflow.worker.app import workflow_runner
from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
from mnemoflow.workflows.user_memory import UserMemoryWorkflow

runner = workflow_runner() if sys.argv[1] == "production" else SandboxedWorkflowRunner()
defns = [temporalio.workflow._Definition.must_from_class(w)
         for w in (MemoryRoundWorkflow, UserMemoryWorkflow)]


async def prepare():
    for _ in range(3):
        for defn in defns:
            runner.prepare_workflow(defn)


counting = True
asyncio.run(prepare())
counting = False
print(json.dumps(dict(ran)))
"""


def _probe(script: str, runner: str) -> Any:
    """What `script` prints last (JSON), run in a Python process of its own with `runner`."""
    done = subprocess.run(
        [sys.executable, "-c", script, runner],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _ran(runner: str) -> dict[str, int]:
    return dict(_probe(PROBE, runner))


def test_the_sdk_default_executes_the_workflow_modules_for_every_run() -> None:
    """The premise, counted the same way (so the next test can fail)."""
    ran = _ran("default")
    assert ran.get("memory_round.py") == 3, ran
    assert ran.get("user_memory.py") == 3, ran


def test_the_production_runner_executes_none_of_our_modules_again() -> None:
    ran = _ran("production")
    assert ran == {}, ran


def test_the_production_runner_keeps_the_sandbox() -> None:
    """Passed through, not unsandboxed: the standard library stays restricted in workflows."""
    from mnemoflow.worker.app import workflow_runner

    runner = workflow_runner()
    assert isinstance(runner, SandboxedWorkflowRunner)
    restrictions = runner.restrictions
    assert PASSED_THROUGH in restrictions.passthrough_modules
    assert restrictions.invalid_module_members is not None
    assert restrictions.invalid_module_members.children  # datetime.now and the like


async def test_every_worker_built_for_production_uses_it(dev_env: WorkflowEnvironment) -> None:
    """`build_workers`, the wiring of `mnemoflow worker`, the dev stack and every end-to-end
    test, hands the runner to each Worker that runs workflows."""
    tag = uuid.uuid4().hex[:10]
    settings = worker_settings(
        task_queue=f"tq-runner-{tag}",
        milvus_uri="http://127.0.0.1:1",  # never reached: the Workers are only built
        collection=f"t_{tag}",
        redis_url="redis://127.0.0.1:1/0",
        key_prefix=f"test:{tag}:",
    )
    res = resolve(settings, Components(HeuristicMemoryModels(), HashingEmbeddings()))
    try:
        [worker] = build_workers(dev_env.client, settings, res)
        runner = worker.config()["workflow_runner"]
        assert isinstance(runner, SandboxedWorkflowRunner)
        assert PASSED_THROUGH in runner.restrictions.passthrough_modules
    finally:
        await res.aclose()


# A redis-py connection pool collected inside a workflow activation (its finalizer runs on the
# workflow's thread, where the sandbox's importer is in place, as a garbage collection there
# runs it), counted in a subprocess of its own (a clean module table): which modules the
# activation's namespace gained, and whether each is the one this process holds.
FINALIZER_PROBE = r"""
import gc, json, sys, warnings
import redis.asyncio
from temporalio.worker.workflow_sandbox import SandboxRestrictions
from temporalio.worker.workflow_sandbox._importer import Importer
from temporalio.worker.workflow_sandbox._restrictions import RestrictionContext

from mnemoflow.worker.app import workflow_runner

restrictions = (
    workflow_runner().restrictions if sys.argv[1] == "production" else SandboxRestrictions.default
)
pool = redis.asyncio.ConnectionPool.from_url("redis://127.0.0.1:1/0")
# A pool that made a connection (every client that connected leaves one): its finalizer
# records the connections it drops, importing the recorder module to do it.
pool._available_connections.append(pool.make_connection())
context = RestrictionContext()
context.in_activation = True
importer = Importer(restrictions, context)
before = set(importer.new_modules)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    with importer.applied():
        del pool  # in a reference cycle (its maintenance-notification handler): freed
        gc.collect()  # by a collection, which runs the finalizer here, on this thread
gained = {n: m is sys.modules.get(n) for n, m in importer.new_modules.items() if n not in before}
print(json.dumps({"gained": gained, "warnings": [str(w.message) for w in seen]}))
"""


def _finalizer_in_activation(runner: str) -> dict[str, Any]:
    return dict(_probe(FINALIZER_PROBE, runner))


def test_a_finalizer_that_imports_in_an_activation_imports_afresh_by_default() -> None:
    """The premise, probed the same way (so the next test can fail): with the SDK's default
    restrictions the pool's finalizer imports redis's recorder module, and what it imports,
    afresh into the run's namespace."""
    seen = _finalizer_in_activation("default")
    fresh = [n for n, same in seen["gained"].items() if not same]
    assert "redis.observability.recorder" in fresh, seen
    assert any("imported after initial workflow load" in w for w in seen["warnings"]), seen


def test_the_production_runner_hands_a_finalizer_the_modules_of_this_process() -> None:
    seen = _finalizer_in_activation("production")
    assert seen["gained"].get("redis.observability.recorder") is True, seen
    assert all(seen["gained"].values()), seen  # nothing imported afresh in the sandbox
    assert not any("imported after initial workflow load" in w for w in seen["warnings"]), seen
