"""A real memory worker in its own process, for tests that kill workers with SIGKILL.

    python -m tests.support.worker_process --address 127.0.0.1:7233 --task-queue tq \\
        --milvus http://127.0.0.1:19530 --redis redis://127.0.0.1:6379/0 \\
        --collection c --prefix p: --ready-file /tmp/ready [--slow-index-s 30] [--slow-llm-s 30] \\
        [--local-llm-bound-s 2] [--local-store-bound-s 2] [--round-task-timeout-s 10]

The production wiring (worker.app.running_worker) with offline heuristic models and hashing
embeddings; the graceful shutdown is the test workers' short one. With
`--slow-index-s N` every fragment upsert first waits N seconds (the index activity heartbeats
meanwhile), so a test can kill the process while an index activity is running. The ready file
is written once the worker polls; SIGTERM shuts it down gracefully. `--slow-llm-s N` makes every
memory-model call (slice, tune, induct) take N seconds, heartbeating meanwhile. With
`--blocking-index` the wait is a blocking call in a thread that no cancellation stops (the write
happens after it), as a slow pymilvus write would be. `--local-llm-bound-s` and
`--local-store-bound-s` shorten the round's local attempts (workflows.options LOCAL_LLM_BOUND,
LOCAL_STORE_BOUND, read when a round schedules them; the workflow sandbox passes that module
through), so a test that needs the ordinary activity under way waits seconds, not the
production bounds (30 s, 10 s). `--round-task-timeout-s` sets the rounds' workflow-task timeout
(workflows.user_rounds ROUND_TASK_TIMEOUT, 10 s): a round whose task was lost (its worker
killed, or the server restarted, while it held the task) is handed out again after that long.
`--llm-marks FILE` appends a line `<operation> <local|activity>` to FILE as each memory-model
call begins, so a test knows when a call (a round's local slice attempt, say) is under way.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from temporalio import activity

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.models.fragments import Fragment
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.client import connect
from mnemoflow.workflows import options, user_rounds
from tests.support import milvus_index_wait
from tests.support.memory_worker import worker_settings

ROOT = Path(__file__).resolve().parents[2]


class SlowStore(FragmentStore):
    """A FragmentStore whose upsert waits first (the window in which a test kills us)."""

    def __init__(
        self,
        *args: object,
        delay_s: float,
        blocking: bool = False,
        write_log: Path | None = None,
        **kwargs: object,
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.delay_s = delay_s
        self.blocking = blocking
        self.write_log = write_log

    def _log(self, line: str) -> None:
        if self.write_log is not None:
            with self.write_log.open("a") as out:
                out.write(line + "\n")

    async def upsert_vectors(
        self, fragments: list[Fragment], *, query: str | None = None, epoch: int | None = None
    ) -> list[tuple[Fragment, list[float]]]:
        # Every write path (`upsert` too) goes through here: the index activity and the round's
        # store step (with its selection query) call this one.
        checked = {} if epoch is None else {"epoch": epoch}
        if self.blocking:  # like a slow write in pymilvus's thread: cancelling cannot stop it

            async def write() -> list[tuple[Fragment, list[float]]]:
                # The write log says when each held write began and how it ended, so that a
                # test can wait for every write still under way to be over.
                self._log("began")
                await asyncio.to_thread(time.sleep, self.delay_s)
                try:
                    out = await FragmentStore.upsert_vectors(
                        self, fragments, query=query, **checked
                    )
                except Exception as err:
                    self._log(f"ended refused {type(err).__name__}")
                    raise
                self._log(f"ended written {len(out)}")
                return out

            return await asyncio.shield(asyncio.ensure_future(write()))
        await asyncio.sleep(self.delay_s)
        return await super().upsert_vectors(fragments, query=query, **checked)


class MarkedModels(HeuristicMemoryModels):
    """The offline models, writing a line to `marks` as each call begins (before its latency):
    which operation, and whether a local activity or an ordinary one made it."""

    def __init__(self, *, marks: Path, latency_s: float) -> None:
        super().__init__(latency_s=latency_s)
        self.marks = marks

    async def _call(self, operation: str) -> None:
        local = activity.in_activity() and activity.info().is_local
        line = f"{operation} {'local' if local else 'activity'}\n"
        await asyncio.to_thread(_append, self.marks, line)
        await super()._call(operation)


def _append(path: Path, line: str) -> None:
    with path.open("a") as f:
        f.write(line)


async def serve(args: argparse.Namespace) -> None:
    if args.local_llm_bound_s > 0:
        options.LOCAL_LLM_BOUND = timedelta(seconds=args.local_llm_bound_s)
    if args.local_store_bound_s > 0:
        options.LOCAL_STORE_BOUND = timedelta(seconds=args.local_store_bound_s)
    if args.round_task_timeout_s > 0:
        user_rounds.ROUND_TASK_TIMEOUT = timedelta(seconds=args.round_task_timeout_s)
    settings = worker_settings(
        task_queue=args.task_queue,
        milvus_uri=args.milvus,
        collection=args.collection,
        redis_url=args.redis,
        key_prefix=args.prefix,
    )
    settings = settings.model_copy(
        update={"temporal": settings.temporal.model_copy(update={"address": args.address})}
    )
    models = (
        MarkedModels(marks=Path(args.llm_marks), latency_s=args.slow_llm_s)
        if args.llm_marks
        else HeuristicMemoryModels(latency_s=args.slow_llm_s)
    )
    components = Components(models=models, embeddings=HashingEmbeddings())
    if args.slow_index_s > 0:
        components.store = SlowStore(
            uri=args.milvus,
            embeddings=components.embeddings,
            collection=args.collection,
            delay_s=args.slow_index_s,
            blocking=args.blocking_index,
            write_log=Path(args.write_log) if args.write_log else None,
        )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    client = await connect(settings.temporal)
    try:
        async with running_worker(client, settings, components):
            await asyncio.to_thread(Path(args.ready_file).write_text, str(os.getpid()))
            await stop.wait()
    finally:
        if components.store is not None:
            await components.store.close()


@contextmanager
def worker_process(
    tmp: Path, name: str, *, address: str, task_queue: str, milvus: str, redis: str,
    collection: str, prefix: str, slow_index_s: float = 0.0, slow_llm_s: float = 0.0,
    blocking_index: bool = False, local_llm_bound_s: float = 0.0, local_store_bound_s: float = 0.0,
    round_task_timeout_s: float = 0.0,
    write_log: Path | None = None,
    llm_marks: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:  # fmt: skip
    """A worker in its own process (python -m tests.support.worker_process), ready on entry;
    a bound or timeout of 0 keeps the production one."""
    ready = tmp / f"{name}.ready"
    log = (tmp / f"{name}.log").open("wb")
    argv = [
        sys.executable, "-m", "tests.support.worker_process", "--address", address,
        "--task-queue", task_queue, "--milvus", milvus, "--redis", redis,
        "--collection", collection, "--prefix", prefix, "--ready-file", str(ready),
        "--slow-index-s", str(slow_index_s), "--slow-llm-s", str(slow_llm_s),
        "--local-llm-bound-s", str(local_llm_bound_s),
        "--local-store-bound-s", str(local_store_bound_s),
        "--round-task-timeout-s", str(round_task_timeout_s),
        *(["--blocking-index"] if blocking_index else []),
        *(["--write-log", str(write_log)] if write_log is not None else []),
        *(["--llm-marks", str(llm_marks)] if llm_marks else []),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, (tmp / f"{name}.log").read_text()[-2000:]
            assert time.monotonic() < deadline, f"worker {name} did not start"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


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
    parser.add_argument("--slow-llm-s", type=float, default=0.0)
    parser.add_argument("--blocking-index", action="store_true")
    parser.add_argument("--local-llm-bound-s", type=float, default=0.0)
    parser.add_argument("--local-store-bound-s", type=float, default=0.0)
    parser.add_argument("--round-task-timeout-s", type=float, default=0.0)
    parser.add_argument("--write-log", default="")
    parser.add_argument("--llm-marks", default="")
    milvus_index_wait.install()  # as in the test process (tests/conftest.py)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
