"""A real memory worker in its own process, for tests that kill workers with SIGKILL.

    python -m tests.support.worker_process --address 127.0.0.1:7233 --task-queue tq \\
        --milvus http://127.0.0.1:19530 --redis redis://127.0.0.1:6379/0 \\
        --collection c --prefix p: --ready-file /tmp/ready [--slow-index-s 30]

Both workflows and the real activities (offline heuristic models, hashing embeddings). With
`--slow-index-s N` every fragment upsert first waits N seconds (the index activity heartbeats
meanwhile), so a test can kill the process while an index activity is running. The ready file
is written once the worker polls; SIGTERM shuts it down gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.fragments import FragmentActivities
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.activities.llm_activities import LLMActivities
from mnemoflow.activities.read_model import ReadModel, ReadModelActivities
from mnemoflow.models.fragments import Fragment
from mnemoflow.worker.app import activity_methods
from mnemoflow.workflows.memory_round import MemoryRoundWorkflow
from mnemoflow.workflows.user_memory import UserMemoryWorkflow


class SlowStore(FragmentStore):
    """A FragmentStore whose upsert waits first (the window in which a test kills us)."""

    def __init__(self, *args: object, delay_s: float, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.delay_s = delay_s

    async def upsert(self, fragments: list[Fragment]) -> list[str]:
        await asyncio.sleep(self.delay_s)
        return await super().upsert(fragments)


async def serve(args: argparse.Namespace) -> None:
    client = await Client.connect(args.address, data_converter=pydantic_data_converter)
    kwargs = {"uri": args.milvus, "embeddings": HashingEmbeddings(), "collection": args.collection}
    store = (
        SlowStore(delay_s=args.slow_index_s, **kwargs)
        if args.slow_index_s > 0
        else FragmentStore(**kwargs)  # type: ignore[arg-type]
    )
    await store.ensure()
    read_model = ReadModel.from_url(args.redis, prefix=args.prefix)
    objects = [
        LLMActivities(HeuristicMemoryModels(), fragments=store),
        FragmentActivities(store),
        ReadModelActivities(read_model),
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    worker = Worker(
        client,
        task_queue=args.task_queue,
        workflows=[UserMemoryWorkflow, MemoryRoundWorkflow],
        activities=[m for obj in objects for m in activity_methods(obj)],
    )
    try:
        async with worker:
            await asyncio.to_thread(Path(args.ready_file).write_text, str(os.getpid()))
            await stop.wait()
    finally:
        await read_model.close()
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="a memory worker process for fault tests")
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--milvus", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--collection", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--slow-index-s", type=float, default=0.0)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
