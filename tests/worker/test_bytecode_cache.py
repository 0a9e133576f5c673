"""The workflow sandbox loads our modules from bytecode (worker/app.py, workflow_bytecode_cache).

The sandbox imports a workflow's module afresh for every workflow run, and every round is a
run. Under PYTHONDONTWRITEBYTECODE with an editable install there is no `.pyc`, so each run
compiled the module from source. Each case runs in a subprocess of its own, because the
function changes interpreter-wide flags; each counts what the import system compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Counts the sources compiled while the sandbox prepares the round workflow `runs` times,
# as the worker does for every run it starts.
PROBE = r"""
import asyncio, importlib._bootstrap_external as ext, json, os, sys

compiled = []
_orig = ext.SourceLoader.source_to_code


def counting(self, data, path, *args, **kwargs):
    compiled.append(str(path))
    return _orig(self, data, path, *args, **kwargs)


ext.SourceLoader.source_to_code = counting
mode, prefix = sys.argv[1], sys.argv[2]
if prefix:
    sys.pycache_prefix = prefix
from mnemoflow.worker.app import workflow_bytecode_cache

chosen = workflow_bytecode_cache() if mode == "cache" else None
import temporalio.workflow
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from mnemoflow.workflows.memory_round import MemoryRoundWorkflow

defn = temporalio.workflow._Definition.must_from_class(MemoryRoundWorkflow)
runner = SandboxedWorkflowRunner()
before = len(compiled)


async def prepare():
    for _ in range(3):
        runner.prepare_workflow(defn)


asyncio.run(prepare())
in_sandbox = compiled[before:]
print(json.dumps({
    "chosen": chosen,
    "round_module": sum(p.endswith("memory_round.py") for p in in_sandbox),
    "in_sandbox": len(in_sandbox),
    "prefix": sys.pycache_prefix,
    "dont_write": sys.dont_write_bytecode,
    "cached": sorted(os.listdir(chosen)) if chosen else [],
}))
"""


def _probe(mode: str, *, dont_write: bool, prefix: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, prefix],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_it_every_sandboxed_run_compiles_the_round_module() -> None:
    """What the cache is for: the premise, measured the same way."""
    got = _probe("none", dont_write=True)
    assert got["round_module"] == 3


def test_the_round_module_is_compiled_at_most_once_per_process() -> None:
    got = _probe("cache", dont_write=True)
    assert got["chosen"] and got["prefix"] == got["chosen"]
    assert got["dont_write"] is False
    assert got["round_module"] == 0, got
    assert got["cached"], "nothing was written to the private directory"
    # The directory is the process's own and is removed when it exits.
    assert not Path(got["chosen"]).exists()


def test_a_process_that_writes_bytecode_is_left_as_it_is(tmp_path: Path) -> None:
    got = _probe("cache", dont_write=False, prefix=str(tmp_path))
    assert got["chosen"] is None and got["prefix"] == str(tmp_path)
    assert got["round_module"] == 0


def test_a_prefix_the_process_chose_is_kept(tmp_path: Path) -> None:
    got = _probe("cache", dont_write=True, prefix=str(tmp_path))
    assert got["chosen"] is None
    assert got["prefix"] == str(tmp_path) and got["dont_write"] is True


def test_workflow_modules_compiled_at_install_are_left_alone(tmp_path: Path) -> None:
    """A wheel installed by pip (the Docker image) has its `.pyc` beside the sources."""
    module = tmp_path / "installed_workflow.py"
    module.write_text("VALUE = 1\n")
    script = (
        "import importlib.util, py_compile, sys\n"
        "from mnemoflow.worker.app import workflow_bytecode_cache\n"
        f"src = {str(module)!r}\n"
        "py_compile.compile(src, cfile=importlib.util.cache_from_source(src), doraise=True)\n"
        "print(workflow_bytecode_cache(src), sys.pycache_prefix, sys.dont_write_bytecode)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["None", "None", "True"]
