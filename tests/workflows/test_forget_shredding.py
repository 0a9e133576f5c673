"""Forget leaves no readable trace in Temporal when encryption keys are configured (issue 12).

One end-to-end run on a dev server of its own (its SQLite file is what the test reads), with
the production wiring and the settings `Settings.load` would give an encrypted deployment:
per-user data keys in the read model's Redis and pseudonymous user keys. Two users talk, with
distinct planted words; one is forgotten. Then:

(a) the codec endpoint, through the real `temporal workflow show`, shows "[key destroyed]" for
    the forgotten user's histories (the user workflow's old run and its rounds), none of their
    words;
(b) the dev server's database files hold none of their words, nor their user id;
(c) their search attributes hold none of their words (the theme is a vocabulary word);
(d) Milvus and Redis hold none of their words, while the other user's memory is intact and
    readable through the codec; the forgotten user's workflow goes on under a new key.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import random
import string
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from pydantic import SecretStr
from temporalio.client import Client, WorkflowQueryFailedError

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.devstack.processes import LOOPBACK, free_port
from mnemoflow.devstack.temporal_dev import start_temporal_dev, temporal_binary
from mnemoflow.middleware import MemoryClient
from mnemoflow.models import search_attributes as sa
from mnemoflow.worker.app import Components, running_worker
from mnemoflow.worker.client import connect
from mnemoflow.worker.codec_server import build_codec_server, running_codec_server
from mnemoflow.worker.data_keys import close_codec
from mnemoflow.worker.search_attributes import wanted
from mnemoflow.worker.settings import EncryptionSettings, Settings, TemporalSettings
from tests.support.drive import conversation, eventually
from tests.support.invariants import no_messages, said_vs_stored
from tests.support.memory_worker import fresh_settings
from tests.support.operations import settled, turns
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration

MASTER_KEY = base64.b64encode(bytes(range(32))).decode()


def word(rng: random.Random) -> str:
    """A made-up word no model, vocabulary or id contains by chance."""
    return "".join(rng.choices(string.ascii_lowercase, k=14))


def encrypted_settings(base: Settings, address: str) -> Settings:
    """What Settings.load gives a deployment with MNEMOFLOW_ENCRYPTION_KEYS and a user-key
    secret: data keys in the read model's Redis (same URL and prefix)."""
    encryption = EncryptionSettings(encryption_keys=SecretStr(f"k1:{MASTER_KEY}"))
    encryption = encryption.with_data_keys_store(base.redis.url, base.redis.key_prefix)
    temporal = TemporalSettings(
        address=address, task_queue=base.temporal.task_queue, encryption=encryption
    )
    return base.model_copy(update={"temporal": temporal})


def texts(cli_json: str) -> str:
    """Every string of a `temporal ... --output json` answer, base64 payload data decoded."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):
            found.append(node)
            try:
                found.append(base64.b64decode(node, validate=True).decode("utf-8", "replace"))
            except (binascii.Error, ValueError):
                pass

    walk(json.loads(cli_json))
    return "\n".join(found)


async def show(address: str, codec_port: int, workflow_id: str, run_id: str | None) -> str:
    """`temporal workflow show` of one run through the codec endpoint, as searchable text."""
    argv = [temporal_binary(), "workflow", "show", "--workflow-id", workflow_id]
    argv += ["--address", address, "--output", "json"]
    argv += ["--codec-endpoint", f"http://{LOOPBACK}:{codec_port}"]
    if run_id:
        argv += ["--run-id", run_id]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return texts(done.stdout)


async def redis_text(url: str, prefix: str) -> str:
    """Every key and value under the prefix (strings and hashes), as text."""
    client = aioredis.Redis.from_url(url)
    parts: list[str] = []
    try:
        async for key in client.scan_iter(match=f"{prefix}*"):
            parts.append(key.decode())
            kind = (await client.type(key)).decode()
            if kind == "string":
                parts.append((await client.get(key) or b"").decode("utf-8", "replace"))
            elif kind == "hash":
                for field, value in (await client.hgetall(key)).items():
                    parts.append(field.decode() + "=" + value.decode("utf-8", "replace"))
    finally:
        await client.aclose()
    return "\n".join(parts)


def database_bytes(directory: Path) -> bytes:
    """The dev server's SQLite database with its WAL and shared-memory files."""
    files = sorted(directory.glob("temporal.db*"))
    assert files, f"no database file in {directory}"
    return b"".join(f.read_bytes() for f in files)


async def test_forget_leaves_nothing_readable_in_temporal_redis_or_milvus(
    tmp_path: Path,
    milvus_uri: str,
    redis_url: str,
    reliability: Ledger,
    request: pytest.FixtureRequest,
) -> None:
    started = time.monotonic()
    rng = random.Random()
    gone = [word(rng), word(rng)]  # the forgotten user's words
    kept = word(rng)  # the other user's word
    port = free_port()
    address = f"{LOOPBACK}:{port}"
    server = start_temporal_dev(port, None, tmp_path / "temporal.db", wanted())
    try:
        settings = encrypted_settings(fresh_settings(milvus_uri, redis_url), address)
        prefix, queue = settings.redis.key_prefix, settings.temporal.task_queue
        client: Client = await connect(settings.temporal)
        components = Components(models=HeuristicMemoryModels(), embeddings=HashingEmbeddings())
        async with running_worker(client, settings, components) as res:
            memory = MemoryClient(
                temporal=client,
                task_queue=queue,
                redis=redis_url,
                key_prefix=prefix,
                user_key_secret="operator-secret",
            )
            victim, other = f"vera.{word(rng)}@example.com", f"otto-{kept}"
            a, b = gone
            # Only made-up words: the heuristic labels this "general: <a>, <b>", which is what
            # MnemoflowTheme used to carry in the clear.
            said = [f"{a.title()} {b} {a} {b} {a}.", "Noted.", f"{b.title()} {a} {b}.", "Sure."]
            await memory.submit(victim, turns("t", said))
            other_said = [f"{kept.title()} {kept} {kept}.", "Noted."]
            await memory.submit(other, turns("t", other_said))
            before = await settled(memory, victim, 1)
            other_status = await settled(memory, other, 1)
            assert any(a in f.content for f in await res.store.all_for_user(victim))
            victim_wid = memory.workflow_id(victim)
            old_run = (await client.get_workflow_handle(victim_wid).describe()).run_id
            rounds = [r.workflow_id for r in before.rounds]
            assert rounds and victim not in victim_wid

            receipt = await memory.forget(victim)
            assert receipt.keys_destroyed == 1 and receipt.fragments_deleted >= 1

            async def continued() -> bool:
                desc = await client.get_workflow_handle(victim_wid).describe()
                return desc.run_id != old_run

            await eventually(continued, deadline_s=30, what="the user workflow continued as new")

            # A worker asked to replay the old run (a query of a closed run does that) cannot
            # decode it, also in this process that had the key cached (the destroy dropped it):
            # the query fails at once (its failure is a KeyDestroyedError, sealed), nothing is
            # retried or stuck.
            old_handle = client.get_workflow_handle(victim_wid, run_id=old_run)
            with pytest.raises(WorkflowQueryFailedError):
                await asyncio.wait_for(old_handle.query("status"), 30)

            # (d) Milvus and Redis: nothing of the victim; the other user is intact.
            assert await res.store.all_for_user(victim) == []
            in_redis = await redis_text(redis_url, prefix)
            assert a not in in_redis and b not in in_redis
            assert kept in in_redis
            assert any(kept in f.content for f in await res.store.all_for_user(other))
            recalled = await memory.recall(other, kept)
            assert any(kept in f.content for f in recalled.fragments)

            # (a) The codec endpoint, through the real CLI: "key destroyed", not the words.
            codec = build_codec_server(settings.temporal, require_token=False)
            async with running_codec_server(codec, LOOPBACK, 0) as codec_port:
                for wid, run in [(victim_wid, old_run), *((r, None) for r in rounds)]:
                    text = await show(address, codec_port, wid, run)
                    assert "[key destroyed]" in text, wid
                    assert a not in text and b not in text, wid
                other_text = await show(address, codec_port, memory.workflow_id(other), None)
                assert kept in other_text and "[key destroyed]" not in other_text

            # (c) Search attributes: the victim's rounds are still listed, with no words.
            query = f"MnemoflowUser = '{memory.search_user(victim)}'"
            listed = [w async for w in client.list_workflows(query)]
            assert {w.id for w in listed} >= set(rounds)
            for execution in listed:
                values = " ".join(str(p.value) for p in execution.typed_search_attributes)
                assert a not in values and b not in values and victim not in values
                theme = execution.typed_search_attributes.get(sa.THEME)
                assert theme is None or theme in sa.THEME_VOCABULARY

            # The forgotten user goes on under a new key: a message said after the forget is
            # indexed (consolidated now rather than waiting for it to mature).
            fresh = word(rng)
            lines = [f"{fresh.title()} {fresh}.", "Ok."]
            await memory.submit(victim, conversation("t2", lines, time.time() + 1, step=1))
            assert (await memory.consolidate(victim, "t2")).pending_turns == 2

            async def indexed() -> bool:
                return any(fresh in f.content for f in await res.store.all_for_user(victim))

            await eventually(indexed, deadline_s=60, what="a message after the forget indexed")
            # Counted: the victim's lines from before the forget in no row, the line said
            # after it stored once (its reply may still wait), the other user's lines once.
            outcome = no_messages()
            outcome += await said_vs_stored(res.store, victim, None, {"t2": lines[:1]},
                                            forgotten=said)  # fmt: skip
            outcome += await said_vs_stored(res.store, other, other_status, {"t": other_said})
            assert outcome.clean, outcome
            await memory.aclose()
            for wid in (victim_wid, memory.workflow_id(other)):
                await client.get_workflow_handle(wid).terminate("test finished")
        await close_codec(client.data_converter.payload_codec)

        # (b) The database files: none of the victim's words nor their id; the other user's
        # (hashed) workflow id is there, so these are the files the server wrote.
        server.stop()
        raw = database_bytes(tmp_path)
        assert memory.workflow_id(other).encode() in raw
        for text in (*gone, victim):
            for form in {text, text.title(), text.upper()}:
                assert form.encode() not in raw, form
    finally:
        server.stop()
    reliability.record(
        request,
        key="forget-crypto-shredding",
        kind="fault",
        what="a user forgotten with encryption keys configured (Temporal keeps their histories "
        "until the namespace retention)",
        happened="their data key is destroyed: the codec shows '[key destroyed]' for their old "
        "run and rounds; the database file, search attributes, Milvus and Redis hold none of "
        "their words; the other user's memory reads back; the user workflow continued as new",
        outcome=outcome,
        started=started,
    )
