"""A user's workflow id does not depend on how a client was built (issue 29, item 12).

With encryption keys, user keys are pseudonymous by default: an operator's `mnemoflow forget
USER` (keys and MNEMOFLOW_USER_KEY_SECRET set) addresses `pseudonymous_workflow_id`. An agent
that built `MemoryClient(...)` directly without the secret used to address the readable id,
so the forget exited 0 while the agent's workflow kept the user's memory and served it.

(a) The public constructor now resolves user keys as the processes do: keys without a secret
    are refused, unless readable keys are chosen explicitly.
(b) A process configured for readable keys (chosen explicitly) while the operator's CLI is
    pseudonymous: the CLI's forget reaches the workflow that holds the memory, the agent's
    `context()` serves none of the forgotten words, and a line said after the forget is stored.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import SecretStr
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.middleware import MemoryClient
from mnemoflow.models.ids import pseudonymous_workflow_id, user_workflow_id
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.client import connect
from mnemoflow.worker.data_keys import KeyDestroyedError, close_codec
from mnemoflow.worker.settings import Settings
from tests.support.drive import conversation, eventually
from tests.support.histories import user_key_payloads
from tests.support.invariants import said_vs_stored
from tests.support.memory_worker import fresh_settings
from tests.support.operations import settled, turns
from tests.support.reliability import Ledger
from tests.workflows.test_forget_shredding import MASTER_KEY, encrypted_settings, word

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "operator-secret"


def _address(env: WorkflowEnvironment) -> str:
    return env.client.service_client.config.target_host


async def test_a_client_with_keys_and_no_secret_is_refused(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), _address(dev_env))
    client = await connect(settings.temporal)
    try:
        common = {"temporal": client, "task_queue": settings.temporal.task_queue}
        # The agent: keys in its Temporal client, no secret. It used to address the
        # readable id, which the operator's forget never reaches.
        with pytest.raises(ValueError, match="MNEMOFLOW_USER_KEY_SECRET"):
            MemoryClient(**common, redis=redis_url)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="MNEMOFLOW_USER_KEY_SECRET"):
            MemoryClient(**common, pseudonymous_user_keys=True)  # type: ignore[arg-type]
        # The secret gives what every process with that secret addresses (memory_client,
        # worker, CLI: Settings.user_key_secret follows the same rule).
        with_secret = MemoryClient(**common, user_key_secret=SECRET)  # type: ignore[arg-type]
        assert with_secret.workflow_id("ada") == pseudonymous_workflow_id("ada")
        mnemoflow = settings.mnemoflow.model_copy(update={"user_key_secret": SecretStr(SECRET)})
        cli = settings.model_copy(update={"mnemoflow": mnemoflow})
        assert cli.user_key_secret() == SECRET.encode()
        # Readable ids only when chosen explicitly (a deployment that keeps its users' ids).
        readable = MemoryClient(**common, pseudonymous_user_keys=False)  # type: ignore[arg-type]
        assert readable.workflow_id("ada") == user_workflow_id("ada")
        # A secret without keys is a choice to make explicitly, in a process as in a client.
        plain = {"temporal": dev_env.client, "task_queue": settings.temporal.task_queue}
        with pytest.raises(ValueError, match="MNEMOFLOW_PSEUDONYMOUS_USER_KEYS=true"):
            MemoryClient(**plain, user_key_secret=SECRET)  # type: ignore[arg-type]
        # Settings without keys ignore a secret set for every process (readable, as always).
        unencrypted = fresh_settings(milvus_uri, redis_url)
        secret_only = unencrypted.mnemoflow.model_copy(
            update={"user_key_secret": SecretStr(SECRET)}
        )
        assert unencrypted.model_copy(update={"mnemoflow": secret_only}).user_key_secret() is None
        chosen = MemoryClient(**plain, user_key_secret=SECRET, pseudonymous_user_keys=True)  # type: ignore[arg-type]
        assert chosen.workflow_id("ada") == pseudonymous_workflow_id("ada")
        assert MemoryClient(**plain).workflow_id("ada") == user_workflow_id("ada")  # type: ignore[arg-type]
    finally:
        await close_codec(client.data_converter.payload_codec)


def _cli_env(settings: Settings) -> dict[str, str]:
    """The operator's environment: the same services, keys and the user-key secret."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "MNEMOFLOW_"))}
    keep = {k: v for k, v in keep.items() if not k.startswith(("REDIS_", "MILVUS_", "DEEPSEEK_"))}
    return {
        **keep,
        "TEMPORAL_ADDRESS": settings.temporal.address,
        "TEMPORAL_TASK_QUEUE": settings.temporal.task_queue,
        "MNEMOFLOW_ENCRYPTION_KEYS": f"k1:{MASTER_KEY}",
        "MNEMOFLOW_USER_KEY_SECRET": SECRET,
        "REDIS_URL": settings.redis.url,
        "REDIS_KEY_PREFIX": settings.redis.key_prefix,
        "MILVUS_URI": settings.milvus.uri,
        "MILVUS_COLLECTION": settings.milvus.collection,
        "MILVUS_EMBEDDING": "hashing",
        "MNEMOFLOW_MODELS": "heuristic",
    }


async def test_operator_forget_reaches_the_workflow_that_holds_the_memory(
    dev_env: WorkflowEnvironment,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random()
    settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), _address(dev_env))
    client = await connect(settings.temporal)
    components = Components(models=HeuristicMemoryModels(), embeddings=HashingEmbeddings())
    user = f"vera-{word(rng)}"
    gone = [word(rng) for _ in range(3)]
    try:
        async with running_worker(client, settings, components) as res:
            agent = MemoryClient(
                temporal=client,
                task_queue=settings.temporal.task_queue,
                redis=redis_url,
                key_prefix=settings.redis.key_prefix,
                pseudonymous_user_keys=False,
            )
            said = []
            for g in gone:
                said += [f"{g.title()} {g} {g} is my code word.", "Noted."]
            await agent.submit(user, turns("t", said))
            await settled(agent, user, 1)
            ctx = await agent.context(user)
            assert ctx is not None and any(gone[0] in f.content for f in ctx.fragments)

            argv = [sys.executable, "-m", "mnemoflow.ops.cli", "forget", user]
            done = await asyncio.to_thread(
                subprocess.run,
                argv,
                cwd=ROOT,
                env=_cli_env(settings),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            receipt = json.loads(done.stdout)
            assert receipt["keys_destroyed"] >= 1 and receipt["fragments_deleted"] >= 1

            # What the agent is served now: its own workflow was forgotten, none of the words.
            ctx = await agent.context(user)
            served = [
                f for f in (ctx.fragments if ctx else []) if any(g in f.content for g in gone)
            ]
            status = await agent.status(user)
            assert status is not None
            held = [g for g in gone if g in json.dumps(status.model_dump(), ensure_ascii=False)]
            stored = [
                f for f in await res.store.all_for_user(user) if any(g in f.content for g in gone)
            ]
            assert (served, held, stored) == ([], [], [])
            # No second, empty workflow was started to hide where the memory is.
            with pytest.raises(RPCError) as missing:
                await client.get_workflow_handle(pseudonymous_workflow_id(user)).describe()
            assert missing.value.status == RPCStatusCode.NOT_FOUND

            # The agent goes on: a line said after the forget is stored.
            fresh = word(rng)
            lines = [f"{fresh.title()} {fresh} is new.", "Ok."]
            await agent.submit(user, conversation("t2", lines, time.time() + 1, step=1))
            await agent.consolidate(user, "t2")

            async def indexed() -> bool:
                return any(fresh in f.content for f in await res.store.all_for_user(user))

            await eventually(indexed, deadline_s=60, what="a line said after the forget stored")
            outcome = await said_vs_stored(
                res.store, user, None, {"t2": [lines[0]]}, forgotten=gone
            )
            assert outcome.clean, outcome
            await agent.aclose()
            await client.get_workflow_handle(agent.workflow_id(user)).terminate("test finished")
    finally:
        await close_codec(client.data_converter.payload_codec)
    reliability.record(
        request,
        key="forget-other-id-form",
        kind="fault",
        what="an agent process on readable user keys while the operator's `mnemoflow forget` is "
        "pseudonymous (keys and MNEMOFLOW_USER_KEY_SECRET): two ids for one user",
        happened=f"the CLI forget reached the agent's workflow: {len(served)} forgotten "
        f"fragments served by context(), {len(stored)} in Milvus, {len(held)} words in its "
        "state; a client with keys and no secret is refused at construction",
        outcome=outcome,
        started=started,
    )


async def test_forget_when_both_id_forms_run(
    dev_env: WorkflowEnvironment, milvus_uri: str, redis_url: str
) -> None:
    """Both forms ran (a readable-key agent and a pseudonymous one, before clients refused the
    mix): the forget reaches both, ends the readable one, destroys the shared keys once, and
    the user goes on under the pseudonymous id."""
    rng = random.Random()
    settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), _address(dev_env))
    client = await connect(settings.temporal)
    components = Components(models=HeuristicMemoryModels(), embeddings=HashingEmbeddings())
    user, said = f"bo-{word(rng)}", [word(rng), word(rng)]
    common = {
        "temporal": client,
        "task_queue": settings.temporal.task_queue,
        "redis": redis_url,
        "key_prefix": settings.redis.key_prefix,
    }
    try:
        async with running_worker(client, settings, components) as res:
            readable = MemoryClient(**common, pseudonymous_user_keys=False)  # type: ignore[arg-type]
            operator = MemoryClient(**common, user_key_secret=SECRET)  # type: ignore[arg-type]
            for memory, w in ((readable, said[0]), (operator, said[1])):
                await memory.submit(user, turns("t", [f"{w.title()} {w} is my code.", "Ok."]))
                await settled(memory, user, 1)
            runs = {}
            for wid in (readable.workflow_id(user), operator.workflow_id(user)):
                runs[wid] = (await client.get_workflow_handle(wid).describe()).run_id
            sealed = []
            for wid, run in runs.items():
                events = (await client.get_workflow_handle(wid, run_id=run).fetch_history()).events
                sealed += user_key_payloads(list(events))

            receipt = await operator.forget(user)
            assert receipt.workflows_forgotten == 2 and receipt.keys_destroyed >= 1
            ended = await client.get_workflow_handle(readable.workflow_id(user)).describe()
            assert ended.status == WorkflowExecutionStatus.TERMINATED
            rows = " ".join(f.content for f in await res.store.all_for_user(user))
            assert [w for w in said if w in rows] == []
            codec = client.data_converter.payload_codec
            assert codec is not None
            readable_left = 0
            for payload in sealed:
                try:
                    await codec.decode([payload])
                    readable_left += 1
                except KeyDestroyedError:
                    pass
            assert readable_left == 0, f"{readable_left} of {len(sealed)} payloads decrypt"

            fresh = word(rng)
            await operator.submit(
                user, conversation("t2", [f"{fresh.title()} {fresh}.", "Ok."], time.time() + 1)
            )
            await operator.consolidate(user, "t2")

            async def indexed() -> bool:
                return any(fresh in f.content for f in await res.store.all_for_user(user))

            await eventually(indexed, deadline_s=60, what="a line said after the forget stored")
            await readable.aclose()
            await operator.aclose()
            await client.get_workflow_handle(operator.workflow_id(user)).terminate("done")
    finally:
        await close_codec(client.data_converter.payload_codec)
