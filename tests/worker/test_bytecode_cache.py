"""The workflow sandbox loads our modules from bytecode (worker/app.py, workflow_bytecode_cache).

The sandbox imports a workflow's module afresh for every workflow run, and every round is a
run. Under PYTHONDONTWRITEBYTECODE with an editable install there is no `.pyc`, so each run
compiled the module from source. Each case runs in a subprocess of its own, because the
function changes interpreter-wide flags, with a cache home of its own (XDG_CACHE_HOME); each
counts what the import system compiled.
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
    "cached": sum(len(files) for _, _, files in os.walk(chosen)) if chosen else 0,
    "round_module_anywhere": sum(p.endswith("memory_round.py") for p in compiled),
}))
"""


def _env(cache_home: Path, *, dont_write: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.pop("PYTHONPYCACHEPREFIX", None)
    env["XDG_CACHE_HOME"] = str(cache_home)
    if dont_write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(script: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def _probe(mode: str, cache_home: Path, *, dont_write: bool, prefix: str = "") -> dict:
    return json.loads(_run(PROBE, _env(cache_home, dont_write=dont_write), mode, prefix))


def test_without_it_every_sandboxed_run_compiles_the_round_module(tmp_path: Path) -> None:
    """What the cache is for: the premise, measured the same way."""
    got = _probe("none", tmp_path, dont_write=True)
    assert got["round_module"] == 3


def test_the_round_module_is_compiled_once_and_the_next_process_finds_it(tmp_path: Path) -> None:
    first = _probe("cache", tmp_path, dont_write=True)
    mine = tmp_path / "mnemoflow" / "bytecode"
    assert first["chosen"] == str(mine) and first["prefix"] == str(mine)
    assert first["dont_write"] is False
    assert first["round_module"] == 0 and first["round_module_anywhere"] == 1, first
    assert first["cached"] > 0, "nothing was written to the cache"
    assert mine.stat().st_mode & 0o777 == 0o700
    # A cache, kept after the process (a `mnemoflow` command ends with os._exit anyway): the
    # next process compiles nothing of ours it already compiled.
    second = _probe("cache", tmp_path, dont_write=True)
    assert second["chosen"] == str(mine) and second["round_module_anywhere"] == 0, second


def test_a_cache_dir_others_can_write_to_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / "mnemoflow" / "bytecode"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    got = _probe("cache", tmp_path, dont_write=True)
    assert got["chosen"] is None and got["prefix"] is None and got["dont_write"] is True


def test_a_process_that_writes_bytecode_is_left_as_it_is(tmp_path: Path) -> None:
    got = _probe("cache", tmp_path, dont_write=False, prefix=str(tmp_path / "own"))
    assert got["chosen"] is None and got["prefix"] == str(tmp_path / "own")
    assert got["round_module"] == 0


def test_a_prefix_the_process_chose_is_kept(tmp_path: Path) -> None:
    got = _probe("cache", tmp_path, dont_write=True, prefix=str(tmp_path / "own"))
    assert got["chosen"] is None
    assert got["prefix"] == str(tmp_path / "own") and got["dont_write"] is True


# Compiles a module beside its source, as pip does at install, optionally changes the source
# afterwards (a stale .pyc), then asks for the cache with that module as the probe.
INSTALLED = r"""
import importlib.util, py_compile, sys
from mnemoflow.worker.app import workflow_bytecode_cache

src, stale = sys.argv[1], sys.argv[2] == "stale"
py_compile.compile(src, cfile=importlib.util.cache_from_source(src), doraise=True)
if stale:
    with open(src, "a") as f:
        f.write("OTHER = 2\n")
print(workflow_bytecode_cache(src) is not None, sys.pycache_prefix is not None)
"""


def test_workflow_modules_compiled_at_install_are_left_alone(tmp_path: Path) -> None:
    """A wheel installed by pip (the Docker image) has a current `.pyc` beside the sources;
    a stale one (the source changed since) does not count."""
    module = tmp_path / "installed_workflow.py"
    module.write_text("VALUE = 1\n")
    env = _env(tmp_path / "cache", dont_write=True)
    assert _run(INSTALLED, env, str(module), "current").split() == ["False", "False"]
    assert _run(INSTALLED, env, str(module), "stale").split() == ["True", "True"]
