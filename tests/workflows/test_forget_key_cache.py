"""After a forget returns, no other process decrypts the user's payloads (issue 29, item 4).

Production wiring with encryption keys and per-user data keys on a dev server. A second
process's client (its own Temporal client, codec and data key cache, as an agent process or the
codec server has) reads the user's history through its codec before the forget, so its cache
holds the user's key (`MNEMOFLOW_DATA_KEYS_CACHE_S`, 30 s by default). The operator's client
forgets the user; right after the receipt, the second client decodes every user-key payload of
that history again: none opens. It used to open all of them for up to 30 s.
"""

from __future__ import annotations

import random
import time

import pytest
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.user_keys import DESTROY_USER_KEY, RETIRE_USER_KEY
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.client import connect
from mnemoflow.worker.data_keys import close_codec
from tests.support.histories import user_key_payloads
from tests.support.invariants import still_readable
from tests.support.memory_worker import fresh_settings
from tests.support.operations import settled, turns
from tests.support.reliability import Ledger
from tests.workflows.test_forget_shredding import encrypted_settings, word

pytestmark = pytest.mark.integration


def _completed_at(events: list[HistoryEvent], activity_type: str) -> float:
    """When the (last) activity of this type completed in a history, in seconds."""
    scheduled = {
        e.event_id
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == activity_type
    }
    done = [
        e.event_time.ToDatetime().timestamp()
        for e in events
        if e.HasField("activity_task_completed_event_attributes")
        and e.activity_task_completed_event_attributes.scheduled_event_id in scheduled
    ]
    assert done, f"no completed {activity_type}"
    return done[-1]


async def retire_to_destroy_s(client: Client, workflow_id: str, run_id: str) -> float:
    """Seconds from the forgotten run's retire of the keys to their destroy in the next run."""
    forgotten = list(
        (await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()).events
    )
    last = forgotten[-1]
    assert last.HasField("workflow_execution_continued_as_new_event_attributes")
    next_run = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    following = list(
        (await client.get_workflow_handle(workflow_id, run_id=next_run).fetch_history()).events
    )
    return _completed_at(following, DESTROY_USER_KEY) - _completed_at(forgotten, RETIRE_USER_KEY)


async def test_no_other_process_decrypts_after_the_forget_returns(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random()
    address = dev_env.client.service_client.config.target_host
    settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), address)
    operator = await connect(settings.temporal)
    other = await connect(settings.temporal)  # its own codec and data key cache
    other_codec = other.data_converter.payload_codec
    assert other_codec is not None and operator.data_converter.payload_codec is not other_codec
    components = Components(models=HeuristicMemoryModels(), embeddings=HashingEmbeddings())
    user, planted = f"ada-{word(rng)}", word(rng)
    try:
        async with running_worker(operator, settings, components):
            memory = MemoryClient(
                temporal=operator,
                task_queue=settings.temporal.task_queue,
                redis=redis_url,
                key_prefix=settings.redis.key_prefix,
                user_key_secret="operator-secret",
            )
            lines = [f"{planted.title()} {planted} is my pass phrase.", "Noted."]
            await memory.submit(user, turns("t", lines))
            await settled(memory, user, 1)
            handle = other.get_workflow_handle(memory.workflow_id(user))
            history = await handle.fetch_history()
            sealed = user_key_payloads(list(history.events))
            assert len(sealed) >= 3
            # The other process reads them all: its cache now holds the user's key.
            opened = await other_codec.decode(sealed)
            read_at = time.monotonic()
            assert any(planted.encode() in p.data for p in opened)

            run_n = (await handle.describe()).run_id
            receipt = await memory.forget(user)
            assert receipt.keys_destroyed >= 1
            window_s = await retire_to_destroy_s(other, memory.workflow_id(user), run_n)
            # Right after the receipt, well inside the 30 s cache.
            outcome = await still_readable(other_codec, sealed)
            readable = outcome.duplicated
            # All inside the cache bound of what the other process read.
            assert time.monotonic() - read_at < settings.temporal.encryption.data_keys_cache_s
            assert readable == 0, f"{readable} of {len(sealed)} payloads still decrypt"
            print(f"retired key destroyed {window_s:.3f} s after the retire")
            await memory.aclose()
            await operator.get_workflow_handle(memory.workflow_id(user)).terminate("test done")
    finally:
        await close_codec(other_codec)
        await close_codec(operator.data_converter.payload_codec)
    reliability.record(
        request,
        key="forget-key-cache-other-process",
        kind="fault",
        what=f"another process holding the user's data key in its cache (it had decrypted "
        f"their {len(sealed)} history payloads) when the operator's forget returned",
        happened=f"{readable} of {len(sealed)} payloads decrypt in that process after the "
        "receipt: every decode confirms the key in Redis; the retired key was destroyed "
        f"{window_s:.2f} s after the retire, in the run the forget continued as",
        outcome=outcome,
        started=started,
    )
