"""mnemoflow: durable per-user long-term memory for LangChain / LangGraph agents.

The public API, importable from here:

- `DurableMemoryMiddleware`, `MemoryClient`, `memory_tools`, `MemoryNotSettledError`: the agent
  side (and what `MemoryClient.settle` raises when memory has not caught up in time);
- `connect`, `Settings` and `memory_client`: connect a Temporal client with the project's data
  converter, from settings read once at process start, and build a `MemoryClient` on them;
- `MnemoflowStore`: LangGraph's `BaseStore` over a `MemoryClient` (for `create_agent(store=...)`
  and LangMem's memory tools), and `MemoryOutageGuard`, which keeps a turn going when such a
  tool finds memory down;
- `MemoryConfig`: the memory model's knobs (preset, budgets, gates).

Names resolve lazily (PEP 562): the Temporal worker's sandbox imports `mnemoflow.workflows...`,
which runs this file first, and a workflow must not pull in LangChain or pymilvus. The rooms
behind these names and what each may import are in docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mnemoflow.middleware import (
        DurableMemoryMiddleware,
        MemoryClient,
        MemoryNotSettledError,
        MemoryOutageGuard,
        MnemoflowStore,
        memory_tools,
    )
    from mnemoflow.models.config import MemoryConfig
    from mnemoflow.worker.client import connect
    from mnemoflow.worker.memory_client import memory_client
    from mnemoflow.worker.settings import Settings

_EXPORTS = {
    "DurableMemoryMiddleware": "mnemoflow.middleware",
    "MemoryClient": "mnemoflow.middleware",
    "memory_tools": "mnemoflow.middleware",
    "MemoryNotSettledError": "mnemoflow.middleware",
    "MnemoflowStore": "mnemoflow.middleware",
    "MemoryOutageGuard": "mnemoflow.middleware",
    "memory_client": "mnemoflow.worker.memory_client",
    "MemoryConfig": "mnemoflow.models.config",
    "connect": "mnemoflow.worker.client",
    "Settings": "mnemoflow.worker.settings",
}

__all__ = [
    "DurableMemoryMiddleware",
    "MemoryClient",
    "MemoryConfig",
    "MemoryNotSettledError",
    "MemoryOutageGuard",
    "MnemoflowStore",
    "Settings",
    "connect",
    "memory_client",
    "memory_tools",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'mnemoflow' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
