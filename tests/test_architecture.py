"""The rooms of docs/ARCHITECTURE.md import only what the table there allows.

A static check over every module's import statements (the ones inside functions too), so a
lazy import cannot slip a worker client into the agent process or LangChain into a workflow.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ALLOWED: dict[str, set[str]] = {
    "models": set(),
    "memory": {"models"},
    "workflows": {"models", "memory"},
    "activities": {"models", "memory"},
    "middleware": {"models", "memory", "workflows"},
    "worker": {"models", "memory", "workflows", "activities", "middleware"},
    "ops": {
        "models",
        "memory",
        "workflows",
        "activities",
        "middleware",
        "worker",
        "devstack.stack",
    },
    "devstack": {"models", "memory", "workflows", "activities", "middleware", "worker", "ops"},
}
#: Third-party packages a room must never load (the worker sandbox re-imports workflow modules;
#: an agent process must not load the worker's store clients through the middleware).
FORBIDDEN: dict[str, set[str]] = {
    "workflows": {"langchain", "langchain_core", "langgraph", "pymilvus", "redis", "numpy"},
    "models": {"langchain", "langchain_core", "langgraph", "pymilvus", "redis", "numpy"},
    "memory": {"langchain", "langchain_core", "langgraph", "pymilvus", "redis"},
}
#: The `mnemoflow` command table names every audience's commands, each imported lazily inside
#: its handler, so it alone may reach the dev stack.
ENTRY_POINTS = {"ops/cli.py"}


def _imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            if node.module.count(".") == 1:  # `from mnemoflow.devstack import stack`
                found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
    return found


def _violations(room: str) -> list[str]:
    allowed = ALLOWED[room] | {room}
    bad = []
    for path in sorted((ROOT / room).rglob("*.py")):
        if str(path.relative_to(ROOT)) in ENTRY_POINTS:
            continue
        for line, name in _imports(path):
            where = f"{path.relative_to(ROOT)}:{line} imports {name}"
            parts = name.split(".")
            if parts[0] in FORBIDDEN.get(room, set()):
                bad.append(where)
            if parts[0] != "mnemoflow" or len(parts) < 2:
                continue
            target = parts[1]
            if target == room or target in allowed:
                continue
            if len(parts) >= 3 and f"{target}.{parts[2]}" in allowed:
                continue
            if len(parts) == 2 and any(a.startswith(f"{target}.") for a in allowed):
                continue  # `from mnemoflow.devstack import stack`: judged by the alias entry
            bad.append(where)
    return bad


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_room_imports_follow_the_architecture(room: str) -> None:
    assert _violations(room) == []


def test_the_check_sees_a_violation(tmp_path: Path) -> None:
    # The checker itself must be able to fail: a workflow module importing LangChain and a
    # middleware module importing the worker are both reported.
    module = tmp_path / "m.py"
    module.write_text("def f():\n    import langchain_core\n    from mnemoflow.worker import app\n")
    names = [name for _, name in _imports(module)]
    assert "langchain_core" in names and "mnemoflow.worker" in names


def test_every_room_is_mapped_into_the_namespace() -> None:
    for room in ALLOWED:
        link = ROOT / "mnemoflow" / room
        assert link.is_symlink() and link.resolve() == (ROOT / room).resolve(), room


def test_the_public_api_resolves_and_workflows_load_no_langchain() -> None:
    # A fresh interpreter: the package's names are lazy, so importing the workflows (as the
    # worker's sandbox does) must not pull in LangChain, pymilvus or redis.
    code = (
        "import sys, mnemoflow.workflows.user_memory, mnemoflow.workflows.memory_round\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'langchain', 'langchain_core', 'langgraph', 'pymilvus', 'redis'})\n"
        "assert not heavy, heavy\n"
        "import mnemoflow\n"
        "missing = [n for n in mnemoflow.__all__ if getattr(mnemoflow, n, None) is None]\n"
        "assert not missing, missing\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
