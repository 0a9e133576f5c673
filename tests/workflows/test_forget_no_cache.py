"""A forget with per-user data keys completes on a worker that keeps no workflow in its cache
(issue 29, item 5).

The production wiring with encryption keys, but `max_cached_workflows=0`: every workflow task
replays the history from its start, as after a worker restart or an eviction. The forget saga
used to destroy the user's data keys and then continue as new in the next workflow task; a
worker that had lost the run from its cache there could not decode the run's history (sealed
with the destroyed key), and the user workflow stayed stuck on KeyDestroyedError until an
operator terminated it. Now the run retires its key, continues as new, and the new run (sealed
with a new key) destroys the retired one: the forget returns, its receipt counts the destroyed
key, the old run's payloads are unreadable, and lines said after it are stored.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import MemoryClient
from mnemoflow.worker import app
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.client import connect
from mnemoflow.worker.data_keys import KeyDestroyedError, close_codec
from tests.support.drive import conversation, eventually
from tests.support.histories import user_key_payloads
from tests.support.invariants import still_readable, words_stored
from tests.support.memory_worker import fresh_settings
from tests.support.operations import settled, turns
from tests.support.reliability import Ledger
from tests.workflows.test_forget_shredding import encrypted_settings, word

pytestmark = pytest.mark.integration


async def test_forget_completes_when_every_task_replays(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started = time.monotonic()
    rng = random.Random()
    address = dev_env.client.service_client.config.target_host
    settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), address)
    client = await connect(settings.temporal)
    user, gone = f"ada-{word(rng)}", word(rng)
    memory = MemoryClient(
        temporal=client,
        task_queue=settings.temporal.task_queue,
        redis=redis_url,
        key_prefix=settings.redis.key_prefix,
        user_key_secret="operator-secret",
        update_timeout_s=120,
    )
    wid = memory.workflow_id(user)

    def worker() -> Any:
        components = Components(models=HeuristicMemoryModels(), embeddings=HashingEmbeddings())
        return running_worker(client, settings, components)

    try:
        # 1. A worker as usual: the user's first round (its local activities need a cache).
        async with worker():
            await memory.submit(user, turns("t", [f"{gone.title()} {gone} is my pin.", "Ok."]))
            await settled(memory, user, 1)
        old_run = (await client.get_workflow_handle(wid).describe()).run_id
        old_history = await client.get_workflow_handle(wid, run_id=old_run).fetch_history()
        sealed = user_key_payloads(list(old_history.events))

        # 2. The forget on a worker that keeps no workflow in its cache: every task of the
        # saga replays the run from its start, as after a restart at any point of it.
        with monkeypatch.context() as patch:
            patch.setattr(app, "MAX_CACHED_WORKFLOWS", 0)
            async with worker() as res:
                receipt = await memory.forget(user)
                assert receipt.keys_destroyed >= 1
                rows = await res.store.all_for_user(user)
                assert [f for f in rows if gone in f.content] == []
        readable = 0
        for payload in sealed:
            try:
                await client.data_converter.payload_codec.decode([payload])  # type: ignore[union-attr]
                readable += 1
            except KeyDestroyedError:
                pass
        assert readable == 0, f"{readable} of {len(sealed)} old payloads still decrypt"

        # 3. The workflow goes on: lines said after the forget are stored.
        async with worker() as res:
            fresh = [word(rng) for _ in range(2)]
            lines = [f"{fresh[0].title()} {fresh[0]} is new.", f"And {fresh[1]} {fresh[1]}."]
            await memory.submit(user, conversation("t2", lines, time.time() + 1, step=1))
            await memory.consolidate(user, "t2")
            stored: list[str] = []

            async def indexed() -> bool:
                rows = " ".join(f.content for f in await res.store.all_for_user(user))
                stored[:] = [w for w in fresh if w in rows]
                return len(stored) == len(fresh)

            await eventually(indexed, deadline_s=90, what="lines said after the forget stored")
            outcome = await words_stored(res.store, user, fresh)
            assert outcome.clean, outcome
            desc = await client.get_workflow_handle(wid).describe()
            assert desc.run_id != old_run
            await memory.aclose()
            await client.get_workflow_handle(wid).terminate("test finished")
    finally:
        await close_codec(client.data_converter.payload_codec)
    reliability.record(
        request,
        key="forget-worker-without-cache",
        kind="fault",
        what="a forget with per-user data keys on a worker that keeps no workflow in its cache "
        "(every task replays, as after a restart between the key's destruction and the "
        "continue-as-new)",
        happened=f"the forget returned ({receipt.keys_destroyed} key destroyed after the "
        f"continue-as-new); {readable} of the old run's {len(sealed)} payloads decrypt; "
        f"{len(stored)} of {len(fresh)} words said after it stored",
        outcome=outcome + await still_readable(client.data_converter.payload_codec, sealed),
        started=started,
    )
