"""Per-user data keys (crypto-shredding, docs/PRIVACY.md) against a real redis-server.

Wrap and unwrap under the master key, a user's payloads sealed with that user's key (chosen from
the workflow id of the serialization context), master-key rotation, destroying a user's key
(through the forget saga's activity), the decode cache's bound, the codec server's placeholder
and the atomic creation of a user's first key by racing processes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from pydantic import SecretStr
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import ActivitySerializationContext, WorkflowSerializationContext

from mnemoflow.activities.user_keys import UserKeyActivities
from mnemoflow.models.ids import (
    data_key_name,
    data_key_user,
    pseudonymous_workflow_id,
    round_workflow_id,
    user_workflow_id,
    workflow_user_key,
)
from mnemoflow.models.user_keys import DestroyUserKeyInput
from mnemoflow.worker.codec import ENCODING, KEY_ID, CodecError, Keyring, payload_codec
from mnemoflow.worker.data_keys import (
    DESTROYED_METADATA,
    DataKeyStore,
    KeyDestroyedError,
    UserKeyCodec,
    unwrap,
    wrap,
)
from mnemoflow.worker.settings import EncryptionSettings, Settings

K1, K2 = os.urandom(32), os.urandom(32)


def plain(text: str) -> Payload:
    return pydantic_data_converter.payload_converter.to_payloads([text])[0]


def text_of(payload: Payload) -> str:
    return json.loads(payload.data)


def in_workflow(codec: UserKeyCodec, workflow_id: str) -> UserKeyCodec:
    return codec.with_context(
        WorkflowSerializationContext(namespace="default", workflow_id=workflow_id)
    )


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex[:10]}:"


STORES: list[DataKeyStore] = []


@pytest_asyncio.fixture(autouse=True)
async def close_stores() -> AsyncIterator[None]:
    yield
    while STORES:
        await STORES.pop().aclose()


def store(keyring: Keyring, url: str, prefix: str = "mnemoflow:", **kw: Any) -> DataKeyStore:
    made = DataKeyStore(keyring, url, prefix, **kw)
    STORES.append(made)
    return made


def codec(redis_url: str, prefix: str, keyring: Keyring | None = None, **kw: Any) -> UserKeyCodec:
    keyring = keyring or Keyring("k1", {"k1": K1})
    return UserKeyCodec(keyring, store(keyring, redis_url, prefix, cache_s=0.0), **kw)


# --- ids -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "user_id", ["ada", "ada@example.com", "张伟", 'o"brien\\x', "x" * 500, "mnemoflow-user-x"]
)
def test_every_workflow_id_of_a_user_names_the_same_data_key(user_id: str) -> None:
    expected = data_key_user(user_id)
    readable, pseudonymous = user_workflow_id(user_id), pseudonymous_workflow_id(user_id)
    for workflow_id in (readable, pseudonymous, round_workflow_id(readable, 7)):
        assert workflow_user_key(workflow_id) == expected, workflow_id
    assert workflow_user_key(round_workflow_id(pseudonymous, 12)) == expected


@pytest.mark.parametrize(
    "workflow_id", ["codec-cli-1234", "mnemoflow-user-", "mnemoflow-user-ada-xyz", "other/round-1"]
)
def test_workflow_ids_of_no_user_name_no_data_key(workflow_id: str) -> None:
    assert workflow_user_key(workflow_id) is None


# --- wrapping ------------------------------------------------------------------------------------


def test_a_wrapped_key_unwraps_only_for_its_user_and_generation() -> None:
    keyring = Keyring("k1", {"k1": K1})
    dek = os.urandom(32)
    stored = wrap(keyring, "a" * 20, "g1", dek)
    assert stored.startswith("k1:") and base64.b64encode(dek).decode() not in stored
    assert unwrap(keyring, "a" * 20, "g1", stored) == dek
    with pytest.raises(CodecError):
        unwrap(keyring, "b" * 20, "g1", stored)  # copied into another user's hash
    with pytest.raises(CodecError):
        unwrap(keyring, "a" * 20, "g2", stored)
    with pytest.raises(CodecError):
        unwrap(Keyring("k1", {"k1": K2}), "a" * 20, "g1", stored)  # wrong master key


# --- the codec -----------------------------------------------------------------------------------


async def test_each_users_payloads_are_sealed_with_their_own_key(
    redis_url: str, prefix: str
) -> None:
    base = codec(redis_url, prefix)
    ada, bob = user_workflow_id("ada"), user_workflow_id("bob")
    [for_ada] = await in_workflow(base, ada).encode([plain("ada's secret")])
    [for_ada_round] = await in_workflow(base, round_workflow_id(ada, 3)).encode([plain("r")])
    activity_ctx = ActivitySerializationContext(
        namespace="default",
        activity_id="1",
        activity_type="mnemoflow.slice",
        activity_task_queue="q",
        workflow_id=bob,
        workflow_type="MemoryRoundWorkflow",
        is_local=False,
    )
    [for_bob] = await base.with_context(activity_ctx).encode([plain("bob's secret")])
    [no_user] = await base.encode([plain("nobody's")])

    kid = for_ada.metadata[KEY_ID].decode()
    assert for_ada.metadata["encoding"] == ENCODING and b"secret" not in for_ada.data
    assert kid.startswith(f"dek:{data_key_user('ada')}:")
    assert for_ada_round.metadata[KEY_ID].decode() == kid  # the round shares its user's key
    assert for_bob.metadata[KEY_ID].decode().startswith(f"dek:{data_key_user('bob')}:")
    assert no_user.metadata[KEY_ID] == b"k1"  # no user: the master key, as before
    # Decoding needs no context: the key id says everything (the codec server has none).
    decoded = await codec(redis_url, prefix).decode([for_ada, for_bob, no_user])
    assert [text_of(p) for p in decoded] == ["ada's secret", "bob's secret", "nobody's"]
    # Only the wrapped key is stored, and only in Redis.
    client = aioredis.Redis.from_url(redis_url)
    stored = await client.hgetall(data_key_name(prefix, data_key_user("ada")))
    await client.aclose()
    assert set(stored) == {b"active", b"g:" + kid.rsplit(":", 1)[1].encode()}


async def test_master_key_rotation_keeps_old_data_keys_readable(
    redis_url: str, prefix: str
) -> None:
    old_ring = Keyring("k1", {"k1": K1})
    [sealed] = await in_workflow(
        codec(redis_url, prefix, old_ring), user_workflow_id("ada")
    ).encode([plain("before rotation")])
    rotated = codec(redis_url, prefix, Keyring("k2", {"k1": K1, "k2": K2}))
    assert [text_of(p) for p in await rotated.decode([sealed])] == ["before rotation"]
    # ada keeps her data key (wrapped by k1); a new user's key is wrapped by the active k2.
    [again] = await in_workflow(rotated, user_workflow_id("ada")).encode([plain("after")])
    assert again.metadata[KEY_ID] == sealed.metadata[KEY_ID]
    await in_workflow(rotated, user_workflow_id("cy")).encode([plain("new user")])
    client = aioredis.Redis.from_url(redis_url)
    ada_hash = await client.hgetall(data_key_name(prefix, data_key_user("ada")))
    cy_hash = await client.hgetall(data_key_name(prefix, data_key_user("cy")))
    await client.aclose()
    assert [v[:3] for k, v in ada_hash.items() if k.startswith(b"g:")] == [b"k1:"]
    assert [v[:3] for k, v in cy_hash.items() if k.startswith(b"g:")] == [b"k2:"]
    # Retiring k1 too early makes ada's payloads unreadable, with an error naming the key.
    k2_only = codec(redis_url, prefix, Keyring("k2", {"k2": K2}))
    with pytest.raises(CodecError, match="k1"):
        await k2_only.decode([sealed])
    # Re-wrapping every data key with k2 lets k1 go: the same payload reads with k2 alone.
    assert await rotated.store.rewrap_all() == 1
    assert await rotated.store.rewrap_all() == 0
    assert [text_of(p) for p in await k2_only.decode([sealed])] == ["before rotation"]


async def test_destroying_a_users_key_makes_exactly_their_payloads_unreadable(
    redis_url: str, prefix: str
) -> None:
    writer = codec(redis_url, prefix)
    [ada_old] = await in_workflow(writer, user_workflow_id("ada")).encode([plain("forget me")])
    [bob_payload] = await in_workflow(writer, user_workflow_id("bob")).encode([plain("keep me")])
    # Another process decoded ada's payload before the forget: its cache holds her key.
    cached = UserKeyCodec(writer.keyring, store(writer.keyring, redis_url, prefix, cache_s=3600))
    assert text_of((await cached.decode([ada_old]))[0]) == "forget me"

    # The worker process that runs the destroy had it cached too: the activity drops it there.
    local = UserKeyCodec(writer.keyring, store(writer.keyring, redis_url, prefix, cache_s=3600))
    assert text_of((await local.decode([ada_old]))[0]) == "forget me"

    client = aioredis.Redis.from_url(redis_url)
    activities = UserKeyActivities(client, prefix, local.store.forget_cached)
    done = await activities.destroy_user_key(DestroyUserKeyInput(user_id="ada"))
    assert done.destroyed == 1
    assert (await activities.destroy_user_key(DestroyUserKeyInput(user_id="ada"))).destroyed == 0
    assert await client.exists(data_key_name(prefix, data_key_user("ada"))) == 0
    await client.aclose()

    with pytest.raises(KeyDestroyedError, match="key destroyed"):
        await writer.decode([ada_old])
    with pytest.raises(KeyDestroyedError):
        await local.decode([ada_old])
    assert text_of((await writer.decode([bob_payload]))[0]) == "keep me"
    # A process that had the key cached (for an hour) cannot use it either: every decode
    # confirms the key in Redis (issue 29, item 4).
    with pytest.raises(KeyDestroyedError):
        await cached.decode([ada_old])
    # Encrypting always asks Redis: even the cached process seals ada's new payloads with a
    # new key at once, never with the destroyed one.
    [ada_new] = await in_workflow(cached, user_workflow_id("ada")).encode([plain("new life")])
    assert ada_new.metadata[KEY_ID] != ada_old.metadata[KEY_ID]
    assert text_of((await writer.decode([ada_new]))[0]) == "new life"

    # The codec server shows a readable placeholder instead of failing the whole page.
    server_codec = codec(redis_url, prefix, placeholders=True)
    shown = await server_codec.decode([ada_old, bob_payload])
    assert shown[0].metadata[DESTROYED_METADATA] == b"true"
    assert text_of(shown[0]).startswith("[key destroyed]")
    assert b"forget me" not in shown[0].SerializeToString()
    assert text_of(shown[1]) == "keep me"


async def test_racing_processes_create_one_active_key_per_user(redis_url: str, prefix: str) -> None:
    keyring = Keyring("k1", {"k1": K1})
    stores = [store(keyring, redis_url, prefix) for _ in range(4)]
    results = await asyncio.gather(*(s.active("f" * 20) for s in stores for _ in range(5)))
    assert len({generation for generation, _ in results}) == 1
    nonce = os.urandom(12)
    sealed = results[0][1].encrypt(nonce, b"x", None)
    assert all(cipher.decrypt(nonce, sealed, None) == b"x" for _, cipher in results)


async def test_an_unreachable_key_store_is_a_codec_error_not_a_hang() -> None:
    keyring = Keyring("k1", {"k1": K1})
    store = DataKeyStore(keyring, "redis://127.0.0.1:1/0", timeout_s=0.5)
    with pytest.raises(CodecError, match="unreachable"):
        await in_workflow(UserKeyCodec(keyring, store), user_workflow_id("ada")).encode(
            [plain("x")]
        )


def test_settings_choose_the_codec(redis_url: str) -> None:
    keys = f"k1:{base64.b64encode(K1).decode()}"
    enc = EncryptionSettings(encryption_keys=SecretStr(keys))
    assert not enc.data_keys_on  # no store configured: the master-key codec
    with_store = enc.with_data_keys_store(redis_url, "p:")
    assert with_store.data_keys_on and with_store.data_keys_prefix == "p:"
    assert isinstance(payload_codec(with_store), UserKeyCodec)
    assert not isinstance(payload_codec(enc), UserKeyCodec)
    off = EncryptionSettings(encryption_keys=SecretStr(keys), user_data_keys=False)
    assert not off.with_data_keys_store(redis_url, "p:").data_keys_on
    assert not EncryptionSettings().with_data_keys_store(redis_url, "p:").data_keys_on


# --- settings as a deployment reads them ---------------------------------------------------------


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(("MNEMOFLOW_", "TEMPORAL_", "REDIS_")):
            monkeypatch.delenv(name)
    return monkeypatch


def test_with_keys_user_keys_are_pseudonymous_and_data_keys_live_in_redis(
    env: pytest.MonkeyPatch,
) -> None:
    env.setenv("MNEMOFLOW_ENCRYPTION_KEYS", f"k1:{base64.b64encode(K1).decode()}")
    env.setenv("REDIS_URL", "redis://app:hunter2-redis@10.0.0.5:6379/0")
    env.setenv("REDIS_KEY_PREFIX", "shop:")
    with pytest.raises(ValueError, match="MNEMOFLOW_USER_KEY_SECRET"):
        Settings.load()  # pseudonymous by default with keys: its secret is required
    env.setenv("MNEMOFLOW_USER_KEY_SECRET", "operator-secret")
    settings = Settings.load()
    assert settings.user_key_secret() == b"operator-secret"
    enc = settings.temporal.encryption
    assert enc.data_keys_on and enc.data_keys_prefix == "shop:"
    assert enc.data_keys_url is not None
    assert enc.data_keys_url.get_secret_value() == "redis://app:hunter2-redis@10.0.0.5:6379/0"
    assert enc.key_material() == {"k1": K1}  # the copy kept the keys
    summary = str(settings.redacted()) + repr(settings)
    assert "hunter2-redis" not in summary and "'user data keys': 'on'" in summary

    env.setenv("MNEMOFLOW_PSEUDONYMOUS_USER_KEYS", "false")  # an explicit choice wins
    assert Settings.load().user_key_secret() is None
    env.setenv("MNEMOFLOW_USER_DATA_KEYS", "false")
    assert not Settings.load().temporal.encryption.data_keys_on


def test_without_keys_nothing_changes(env: pytest.MonkeyPatch) -> None:
    settings = Settings.load()
    assert settings.user_key_secret() is None
    assert not settings.temporal.encryption.data_keys_on


def test_a_dev_stack_moves_data_keys_that_followed_redis_url(env: pytest.MonkeyPatch) -> None:
    from mnemoflow.devstack.stack import StackInfo

    env.setenv("MNEMOFLOW_ENCRYPTION_KEYS", f"k1:{base64.b64encode(K1).decode()}")
    env.setenv("MNEMOFLOW_USER_KEY_SECRET", "s")
    info = StackInfo(
        temporal_address="127.0.0.1:7300",
        task_queue="q",
        ui_url=None,
        redis_url="redis://127.0.0.1:6400/0",
        milvus_uri="http://127.0.0.1:19600",
        data_dir="/tmp/x",
        pid=1,
    )
    enc = info.apply(Settings.load()).temporal.encryption
    assert enc.data_keys_url is not None
    assert enc.data_keys_url.get_secret_value() == "redis://127.0.0.1:6400/0"
    assert enc.key_material() == {"k1": K1}
    env.setenv("MNEMOFLOW_DATA_KEYS_URL", "redis://keys.internal:6379/3")  # set on purpose: kept
    kept = info.apply(Settings.load()).temporal.encryption.data_keys_url
    assert kept is not None and kept.get_secret_value() == "redis://keys.internal:6379/3"
