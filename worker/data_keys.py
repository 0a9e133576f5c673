"""Per-user data keys: crypto-shredding of what Temporal keeps of a user (docs/PRIVACY.md).

Each user's payloads are sealed with a data key of their own (a DEK: 256-bit AES-GCM), and the
DEK is stored only wrapped (sealed) by the configured master key (the KEK, `codec.Keyring`), in
Redis under `models.ids.data_key_name`: a hash with the field `active` (the generation new
payloads use) and one field `g:<generation>` = `<master key id>:<base64 nonce + wrapped DEK>`
per generation. Temporal never sees a DEK. Forget deletes the hash (`activities.user_keys`):
every payload sealed with that user's keys becomes unreadable, for the codec server, the
workers and anyone holding a copy of the database. The next payload of that user gets a new
generation.

Which user a payload belongs to comes from the SDK's serialization context (the workflow id
of a workflow, of its child, or of the workflow that scheduled an activity), mapped by
`models.ids.workflow_user_key`; payloads without a user keep the master key. An encrypted
payload names its key in `encryption-key-id`: `dek:<user key>:<generation>`, so decoding needs
no context (the codec server has none).

Caching: a process keeps unwrapped DEKs in memory, but never decides from its memory that a
key still exists. Encrypting always asks Redis for the active generation (one round trip,
which also creates the first one atomically), so nothing is sealed with a destroyed key once
the destroy returned. Decrypting asks Redis too: one pipelined round trip per decode call for
every key the call's payloads name, and a cached DEK is used only while Redis still holds the
same wrapped key. So once a forget's destroy returned, no process decrypts that user's
payloads again, whatever it had cached (the cache saves the unwrap, not the read). A DEK
unused for `data_keys_cache_s` is dropped from memory. Master-key rotation: new DEKs are
wrapped with the active master key; a DEK wrapped with an older one unwraps as long as that key
is in the keyring, and `DataKeyStore.rewrap_all` re-wraps them all with the active key so the
older one can go.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Self

import redis.asyncio as aioredis
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from redis.exceptions import RedisError
from temporalio.api.common.v1 import Payload
from temporalio.converter import SerializationContext, WithSerializationContext

from mnemoflow.models.ids import data_key_name, workflow_user_key
from mnemoflow.worker.codec import (
    ENCODING,
    KEY_BYTES,
    KEY_ID,
    NONCE_BYTES,
    CodecError,
    EncryptionCodec,
    Keyring,
)

log = logging.getLogger(__name__)

#: Prefix of the key id of a payload sealed with a user's data key.
DEK_KID_PREFIX = "dek:"
#: Metadata of the placeholder the codec server returns for a payload whose key is destroyed.
DESTROYED_METADATA = "mnemoflow-key-destroyed"
#: Bytes of a generation id (random, so a new generation never reuses an old id).
GENERATION_BYTES = 8

# KEYS[1] = the user's hash; ARGV[1] = a new generation id, ARGV[2] = its wrapped DEK.
# Returns {generation, wrapped} of the active generation, creating ARGV's when there is none.
_ACTIVE_LUA = """
local g = redis.call('HGET', KEYS[1], 'active')
if g then
  local w = redis.call('HGET', KEYS[1], 'g:' .. g)
  if w then return {g, w} end
end
redis.call('HSET', KEYS[1], 'g:' .. ARGV[1], ARGV[2], 'active', ARGV[1])
return {ARGV[1], ARGV[2]}
"""


# KEYS[1] = the user's hash; ARGV[1] = field, ARGV[2] = the value read, ARGV[3] = the new value.
# Replaces a wrapped key only if it is still the one read (a concurrent forget wins).
_REWRAP_LUA = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  return 1
end
return 0
"""


class KeyDestroyedError(CodecError):
    """The payload's data key is gone: its user was forgotten (or the key store lost it)."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _wrap_aad(data_user: str, generation: str) -> bytes:
    # Binds a wrapped DEK to its user and generation: a wrapped key copied into another
    # user's hash does not unwrap there.
    return f"mnemoflow-dek:{data_user}:{generation}".encode()


def wrap(keyring: Keyring, data_user: str, generation: str, dek: bytes) -> str:
    """The stored form of a DEK: `<master key id>:<base64(nonce + sealed DEK)>`."""
    kid = keyring.active_kid
    nonce = os.urandom(NONCE_BYTES)
    sealed = keyring.cipher(kid).encrypt(nonce, dek, _wrap_aad(data_user, generation))
    return f"{kid}:{base64.b64encode(nonce + sealed).decode()}"


def unwrap(keyring: Keyring, data_user: str, generation: str, stored: str) -> bytes:
    """The DEK of a stored wrapped key (CodecError if no key of the keyring opens it)."""
    kid, sep, encoded = stored.partition(":")
    if not sep:
        raise CodecError(f"data key {data_user}:{generation} is not in the wrapped format")
    raw = base64.b64decode(encoded)
    try:
        dek = keyring.cipher(kid).decrypt(
            raw[:NONCE_BYTES], raw[NONCE_BYTES:], _wrap_aad(data_user, generation)
        )
    except InvalidTag:
        raise CodecError(
            f"data key {data_user}:{generation} does not unwrap with master key {kid!r}"
        ) from None
    if len(dek) != KEY_BYTES:
        raise CodecError(f"data key {data_user}:{generation} has {len(dek)} bytes")
    return dek


@dataclass
class _Cached:
    cipher: AESGCM
    wrapped: str  # the stored form it was unwrapped from: reused only while Redis holds it
    read_at: float


#: Past this many cached DEKs, those unused for `cache_s` are dropped (memory only).
_CACHE_PRUNE_AT = 1024


class DataKeyStore:
    """The wrapped DEKs in Redis, with an in-process cache of unwrapped ones (one per process).

    Redis clients are bound to an event loop, so one is kept per loop (tests run several).
    """

    def __init__(
        self,
        keyring: Keyring,
        redis: str | aioredis.Redis,
        prefix: str = "mnemoflow:",
        *,
        cache_s: float = 30.0,
        timeout_s: float = 2.0,
    ) -> None:
        self.keyring = keyring
        self.prefix = prefix
        self.cache_s = cache_s
        self._url = redis if isinstance(redis, str) else None
        self._given = None if isinstance(redis, str) else redis
        self._timeout_s = timeout_s
        self._clients: dict[asyncio.AbstractEventLoop, aioredis.Redis] = {}
        self._ciphers: dict[tuple[str, str], _Cached] = {}

    def redis(self) -> aioredis.Redis:
        """The Redis client of the running event loop."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            for old in [k for k in self._clients if k.is_closed()]:
                del self._clients[old]
            assert self._url is not None
            client = aioredis.Redis.from_url(
                self._url,
                retry=None,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
            )
            self._clients[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the client of the running loop (others die with their loops)."""
        loop = asyncio.get_running_loop()
        client = self._clients.pop(loop, None)
        if client is not None:
            await client.aclose()

    async def active(self, data_user: str) -> tuple[str, AESGCM]:
        """The generation and cipher new payloads of this user are sealed with (created on the
        first use, atomically: two processes never make two active keys for one user)."""
        generation = os.urandom(GENERATION_BYTES).hex()
        fresh = os.urandom(KEY_BYTES)
        wrapped = wrap(self.keyring, data_user, generation, fresh)
        name = data_key_name(self.prefix, data_user)
        try:
            redis = self.redis()
            reply = await redis.eval(_ACTIVE_LUA, 1, name, generation, wrapped)  # type: ignore[misc]
        except (RedisError, OSError) as err:
            raise CodecError(f"data key store unreachable: {type(err).__name__}: {err}") from None
        active, stored = _text(reply[0]), _text(reply[1])
        cached = self._ciphers.get((data_user, active))
        if cached is None or cached.wrapped != stored:
            dek = fresh if active == generation else unwrap(self.keyring, data_user, active, stored)
            cached = _Cached(AESGCM(dek), stored, time.monotonic())
            self._ciphers[(data_user, active)] = cached
        else:
            cached.read_at = time.monotonic()  # Redis just confirmed it exists
        return active, cached.cipher

    async def cipher(self, data_user: str, generation: str) -> AESGCM:
        """The cipher of one generation, to decrypt; KeyDestroyedError when it is gone."""
        found = (await self.ciphers([(data_user, generation)]))[(data_user, generation)]
        if isinstance(found, KeyDestroyedError):
            raise found
        return found

    async def ciphers(
        self, wanted: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], AESGCM | KeyDestroyedError]:
        """The cipher of each (user, generation), read from Redis in one pipelined round trip
        (a cached DEK is reused only if Redis still holds the wrapped key it came from); a
        KeyDestroyedError in place of each one that is gone."""
        keys = list(dict.fromkeys(wanted))
        try:
            async with self.redis().pipeline(transaction=False) as pipe:
                for data_user, generation in keys:
                    pipe.hget(data_key_name(self.prefix, data_user), f"g:{generation}")
                values = await pipe.execute()
        except (RedisError, OSError) as err:
            raise CodecError(f"data key store unreachable: {type(err).__name__}: {err}") from None
        now = time.monotonic()
        found: dict[tuple[str, str], AESGCM | KeyDestroyedError] = {}
        for (data_user, generation), value in zip(keys, values, strict=True):
            if value is None:
                self._ciphers.pop((data_user, generation), None)
                found[(data_user, generation)] = KeyDestroyedError(
                    f"key destroyed: the data key {DEK_KID_PREFIX}{data_user}:{generation} of "
                    "this payload was erased (its user was forgotten); the payload cannot be "
                    "decrypted"
                )
                continue
            stored = _text(value)
            cached = self._ciphers.get((data_user, generation))
            if cached is None or cached.wrapped != stored:
                dek = unwrap(self.keyring, data_user, generation, stored)
                cached = _Cached(AESGCM(dek), stored, now)
                self._ciphers[(data_user, generation)] = cached
            cached.read_at = now
            found[(data_user, generation)] = cached.cipher
        self._prune(now)
        return found

    def _prune(self, now: float) -> None:
        if len(self._ciphers) > _CACHE_PRUNE_AT:
            for key in [k for k, c in self._ciphers.items() if now - c.read_at >= self.cache_s]:
                del self._ciphers[key]

    async def destroy(self, data_user: str) -> int:
        """Erase every generation of the user's data key; the number erased."""
        name = data_key_name(self.prefix, data_user)
        redis = self.redis()
        fields = await redis.hkeys(name)  # type: ignore[misc]
        await redis.delete(name)
        self.forget_cached(data_user)
        return sum(1 for f in fields if _text(f).startswith("g:"))

    async def rewrap_all(self) -> int:
        """Re-wrap every stored data key that an older master key wraps with the active one, so
        the older key can be retired (docs/PRIVACY.md); the number re-wrapped. Data keys and
        payloads are unchanged. A key erased meanwhile stays erased."""
        redis = self.redis()
        active = self.keyring.active_kid
        done = 0
        async for raw_name in redis.scan_iter(match=data_key_name(self.prefix, "*")):
            name = _text(raw_name)
            data_user = name[len(data_key_name(self.prefix, "")) :]
            for raw_field, raw_value in (await redis.hgetall(name)).items():  # type: ignore[misc]
                field, stored = _text(raw_field), _text(raw_value)
                if not field.startswith("g:") or stored.partition(":")[0] == active:
                    continue
                generation = field[2:]
                dek = unwrap(self.keyring, data_user, generation, stored)
                fresh = wrap(self.keyring, data_user, generation, dek)
                done += int(await redis.eval(_REWRAP_LUA, 1, name, field, stored, fresh))  # type: ignore[misc]
        return done

    def forget_cached(self, data_user: str) -> None:
        """Drop this process's copies of the user's keys."""
        for key in [k for k in self._ciphers if k[0] == data_user]:
            del self._ciphers[key]


def placeholder(err: KeyDestroyedError) -> Payload:
    """What the codec server shows for a payload whose key is destroyed: a readable JSON string
    (the Temporal UI and `temporal workflow show` print it where the data would be)."""
    text = "[key destroyed] " + str(err).removeprefix("key destroyed: ")
    return Payload(
        metadata={"encoding": b"json/plain", DESTROYED_METADATA: b"true"},
        data=json.dumps(text).encode(),
    )


class UserKeyCodec(EncryptionCodec, WithSerializationContext):
    """EncryptionCodec that seals a user's payloads with that user's data key.

    Without a serialization context (or one that names no user) it is the master-key codec.
    `placeholders=True` (the codec server only) decodes a payload whose key is destroyed to a
    readable placeholder; workers and clients get KeyDestroyedError instead, never made-up data.
    """

    def __init__(
        self,
        keyring: Keyring,
        store: DataKeyStore,
        data_user: str | None = None,
        *,
        placeholders: bool = False,
    ) -> None:
        super().__init__(keyring)
        self.store = store
        self.data_user = data_user
        self.placeholders = placeholders

    def with_context(self, context: SerializationContext) -> Self:
        """The codec for payloads of this context's workflow (its user's data key, if any)."""
        workflow_id = getattr(context, "workflow_id", None)
        data_user = workflow_user_key(workflow_id) if workflow_id else None
        return type(self)(self.keyring, self.store, data_user, placeholders=self.placeholders)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Seal with the user's active data key, or the master key when there is no user."""
        if self.data_user is None or not payloads:
            return await super().encode(payloads)
        generation, cipher = await self.store.active(self.data_user)
        kid = f"{DEK_KID_PREFIX}{self.data_user}:{generation}"
        sealed = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            data = nonce + cipher.encrypt(nonce, payload.SerializeToString(), kid.encode())
            sealed.append(Payload(metadata={"encoding": ENCODING, KEY_ID: kid.encode()}, data=data))
        return sealed

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Open each payload with the key it names (a user's data key or a master key); the
        user keys of the whole call are confirmed in Redis in one round trip."""
        named = [self._user_kid(payload) for payload in payloads]
        wanted = [key for key in named if key is not None]
        ciphers = await self.store.ciphers(wanted) if wanted else {}
        opened = []
        for payload, key in zip(payloads, named, strict=True):
            if key is None:
                opened.append(self._open(payload))
                continue
            found = ciphers[key]
            if isinstance(found, KeyDestroyedError):
                if not self.placeholders:
                    raise found
                opened.append(placeholder(found))
                continue
            opened.append(self._open_user(payload, key, found))
        return opened

    @staticmethod
    def _user_kid(payload: Payload) -> tuple[str, str] | None:
        """(user, generation) of a payload sealed with a user's data key, else None."""
        kid = payload.metadata.get(KEY_ID, b"").decode(errors="replace")
        if payload.metadata.get("encoding") != ENCODING or not kid.startswith(DEK_KID_PREFIX):
            return None
        data_user, _, generation = kid[len(DEK_KID_PREFIX) :].partition(":")
        if not data_user or not generation:
            raise CodecError(f"malformed data key id {kid[:80]!r}")
        return data_user, generation

    @staticmethod
    def _open_user(payload: Payload, key: tuple[str, str], cipher: AESGCM) -> Payload:
        kid = f"{DEK_KID_PREFIX}{key[0]}:{key[1]}"
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            plain = cipher.decrypt(nonce, sealed, kid.encode())
        except InvalidTag:
            raise CodecError(
                f"payload does not decrypt with data key {kid!r} (tampered, or a key store "
                "that was rebuilt)"
            ) from None
        result = Payload()
        result.ParseFromString(plain)
        return result


async def close_codec(codec: object) -> None:
    """Close the data key store's Redis client of a codec, if it has one (the running loop's;
    a process that ends needs no call, a test that closes its loop does)."""
    store = getattr(codec, "store", None)
    if isinstance(store, DataKeyStore):
        await store.aclose()
