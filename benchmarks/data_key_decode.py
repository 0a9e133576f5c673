"""What a decode call costs with per-user data keys (docs/PRIVACY.md, "Caching").

Every decode call of a user's payloads confirms the user's data key in Redis (one pipelined
round trip), so a forget is honoured by every process at once. This times a decode call of one
and of ten user-key payloads against a master-key decode, on a redis-server started here
(temporary data dir), 5 runs of 2,000 calls each; the median per call is printed.

    python benchmarks/data_key_decode.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec, WorkflowSerializationContext

from mnemoflow.devstack.processes import LOOPBACK, free_port, start_redis
from mnemoflow.worker.codec import EncryptionCodec, Keyring
from mnemoflow.worker.data_keys import DataKeyStore, UserKeyCodec

RUNS, CALLS = 5, 2000


async def per_call_us(codec: PayloadCodec, payloads: list[Payload]) -> float:
    """Median microseconds per decode call over RUNS runs of CALLS calls."""
    runs = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(CALLS):
            await codec.decode(payloads)
        runs.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(runs)


async def main() -> None:
    port = free_port()
    redis = start_redis(port, Path(tempfile.mkdtemp()))
    try:
        ring = Keyring("k1", {"k1": os.urandom(32)})
        store = DataKeyStore(ring, f"redis://{LOOPBACK}:{port}/0", "bench:")
        context = WorkflowSerializationContext(
            namespace="default", workflow_id="mnemoflow-user-ada-" + "a" * 20
        )
        user = UserKeyCodec(ring, store).with_context(context)
        master = EncryptionCodec(ring)
        plain = Payload(metadata={"encoding": b"json/plain"}, data=b'"' + b"x" * 400 + b'"')
        cases = [
            ("user key, 1 payload", user, await user.encode([plain])),
            ("user key, 10 payloads", user, await user.encode([plain] * 10)),
            ("master key, 1 payload", master, await master.encode([plain])),
        ]
        for name, codec, payloads in cases:
            print(f"{name}: {await per_call_us(codec, payloads):.1f} µs per decode call")
        await store.aclose()
    finally:
        redis.stop()


if __name__ == "__main__":
    asyncio.run(main())
