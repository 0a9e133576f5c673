"""The agent side of mnemoflow: the middleware, the client it shares with tools, the tools, and
the LangGraph store."""

from mnemoflow.middleware.client import MemoryClient
from mnemoflow.middleware.durable_memory import (
    DurableMemoryMiddleware,
    DurableMemoryState,
    SyncRunError,
)
from mnemoflow.middleware.outage_guard import MemoryOutageGuard
from mnemoflow.middleware.settle import MemoryNotSettledError
from mnemoflow.middleware.store import MnemoflowStore
from mnemoflow.middleware.tools import memory_tools

__all__ = [
    "DurableMemoryMiddleware",
    "DurableMemoryState",
    "MemoryClient",
    "MemoryNotSettledError",
    "MemoryOutageGuard",
    "MnemoflowStore",
    "SyncRunError",
    "memory_tools",
]
