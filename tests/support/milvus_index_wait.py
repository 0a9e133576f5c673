"""pymilvus's wait for a new index, polled from the start instead of after a fixed 0.5 s.

`MilvusClient.create_collection(..., index_params=...)` (activities/fragment_collection.py)
creates each index and then waits in `GrpcHandler.wait_for_creating_index`, which sleeps 0.5 s
before its first look at the index state. An index on an empty collection is finished at once,
so every collection the suite creates paid 2 x 0.5 s of plain sleep (the fragments collection
has two indexes): in tests/activities alone 54 waits, 27 s of its 47 s.

`install()` wraps that method for this process (the tests' own stores and in-process workers;
worker subprocesses keep the library's wait): it asks for the state at once and then at short
intervals for about 0.4 s, and hands over to the library's own wait (same timeout, same
errors) if the index is still being built. The index is still waited for until Milvus says
it is finished; only the fixed sleep goes. A pymilvus without this method is left alone.
"""

from __future__ import annotations

import time
from typing import Any

#: Pauses before each early look at the index state (s); then the library's own wait.
EARLY_PAUSES = (0.0, 0.01, 0.03, 0.06, 0.1, 0.2)


def install() -> bool:
    """Wrap GrpcHandler.wait_for_creating_index once; False when pymilvus has no such method."""
    try:
        from pymilvus.client.grpc_handler import GrpcHandler, IndexState
    except ImportError:
        return False
    original = getattr(GrpcHandler, "wait_for_creating_index", None)
    if original is None or not hasattr(GrpcHandler, "get_index_state"):
        return False
    if getattr(original, "_polled_early", False):
        return True

    def wait_for_creating_index(
        self: Any,
        collection_name: str,
        index_name: str,
        timeout: float | None = None,
        context: Any = None,
        **kwargs: Any,
    ) -> tuple[bool, str]:
        timestamp = self.alloc_timestamp(context=context)
        for pause in EARLY_PAUSES:
            time.sleep(pause)
            state, reason = self.get_index_state(
                collection_name,
                index_name,
                timeout=timeout,
                timestamp=timestamp,
                context=context,
                **kwargs,
            )
            if state == IndexState.Finished:
                return True, reason
            if state == IndexState.Failed:
                return False, reason
        return original(  # type: ignore[no-any-return]
            self, collection_name, index_name, timeout=timeout, context=context, **kwargs
        )

    wait_for_creating_index._polled_early = True  # type: ignore[attr-defined]
    GrpcHandler.wait_for_creating_index = wait_for_creating_index  # type: ignore[method-assign]
    return True
