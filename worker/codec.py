"""Payload encryption: conversation text reaches Temporal (and its histories) only as ciphertext.

Every payload (workflow and activity inputs and results, signals, queries, updates, memos and,
through the encoded failure attributes, error messages and stack traces) is sealed with AES-GCM
under a 256-bit key before it leaves the process, with a fresh 12-byte nonce each time. The
encrypted payload says `encoding: binary/encrypted` and names its key in `encryption-key-id`,
so keys rotate: encode with the active key, decode with whichever key a payload names, and
keep old keys in the keyring for as long as histories sealed with them are kept. Payloads
that are not encrypted (histories written before encryption was switched on) pass through.

`data_converter(settings)` is the converter `worker.client.connect` uses: pydantic plus this
codec when keys are configured, plain pydantic when they are not. With per-user data keys
(the default when the settings come from `Settings.load`) the codec is `worker.data_keys`'
UserKeyCodec: a user's payloads are sealed with that user's data key, which forget destroys.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)

from mnemoflow.worker.settings import EncryptionSettings

ENCODING = b"binary/encrypted"
KEY_ID = "encryption-key-id"
NONCE_BYTES = 12
KEY_BYTES = 32


class CodecError(ValueError):
    """A payload cannot be decrypted with this keyring."""


class UnknownKeyError(CodecError):
    """The payload names a key id the keyring does not hold (a key removed too early)."""


class Keyring:
    """The encryption keys by id and the id of the one new payloads are sealed with."""

    def __init__(self, active_kid: str, keys: Mapping[str, bytes]) -> None:
        if active_kid not in keys:
            raise ValueError(f"active key id {active_kid!r} is not among the keys {list(keys)}")
        for kid, key in keys.items():
            if len(key) != KEY_BYTES:
                raise ValueError(f"key {kid!r} has {len(key)} bytes; AES-256 needs {KEY_BYTES}")
        self.active_kid = active_kid
        self._ciphers = {kid: AESGCM(key) for kid, key in keys.items()}

    @classmethod
    def from_settings(cls, settings: EncryptionSettings) -> Keyring | None:
        """The configured keyring, or None when no key is configured (encryption off)."""
        keys = settings.key_material()
        if not keys:
            return None
        return cls(settings.active_key_id(keys), keys)

    @property
    def key_ids(self) -> list[str]:
        """Every key id this keyring can decode."""
        return list(self._ciphers)

    def cipher(self, kid: str) -> AESGCM:
        """The cipher of key `kid`; UnknownKeyError names the ids it does hold."""
        try:
            return self._ciphers[kid]
        except KeyError:
            raise UnknownKeyError(
                f"payload encrypted with key id {kid!r}, which is not in the keyring "
                f"(known: {', '.join(self._ciphers)}); add that key to MNEMOFLOW_ENCRYPTION_KEYS"
            ) from None

    def __repr__(self) -> str:  # never the key bytes
        return f"Keyring(active_kid={self.active_kid!r}, key_ids={self.key_ids!r})"


class EncryptionCodec(PayloadCodec):
    """AES-GCM payload codec over a keyring (see the module docstring for the format)."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Seal each payload (its whole serialized form) with the active key."""
        kid = self.keyring.active_kid
        cipher = self.keyring.cipher(kid)
        sealed = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            data = nonce + cipher.encrypt(nonce, payload.SerializeToString(), None)
            metadata = {"encoding": ENCODING, KEY_ID: kid.encode()}
            sealed.append(Payload(metadata=metadata, data=data))
        return sealed

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Open each encrypted payload with the key it names; pass the others through."""
        return [self._open(payload) for payload in payloads]

    def _open(self, payload: Payload) -> Payload:
        if payload.metadata.get("encoding") != ENCODING:
            return payload  # written before encryption was switched on
        raw_kid = payload.metadata.get(KEY_ID)
        if not raw_kid:
            raise CodecError(f"encrypted payload without the {KEY_ID} metadata")
        kid = raw_kid.decode(errors="replace")
        if kid.startswith("dek:"):
            raise CodecError(
                f"payload sealed with the per-user data key {kid[:80]!r}: this codec has no data "
                "key store (MNEMOFLOW_USER_DATA_KEYS with Redis, worker.data_keys)"
            )
        cipher = self.keyring.cipher(kid)
        nonce, sealed = payload.data[:NONCE_BYTES], payload.data[NONCE_BYTES:]
        try:
            plain = cipher.decrypt(nonce, sealed, None)
        except InvalidTag:
            raise CodecError(
                f"payload does not decrypt with key {kid!r} (wrong key material or tampered)"
            ) from None
        opened = Payload()
        opened.ParseFromString(plain)
        return opened


def payload_codec(settings: EncryptionSettings, *, placeholders: bool = False) -> PayloadCodec:
    """The codec of these settings: per-user data keys when configured (`worker.data_keys`),
    else the master keyring alone. ValueError when no key is configured."""
    keyring = Keyring.from_settings(settings)
    if keyring is None:
        raise ValueError("no encryption key configured (MNEMOFLOW_ENCRYPTION_KEYS)")
    if not settings.data_keys_on:
        return EncryptionCodec(keyring)
    from mnemoflow.worker.data_keys import DataKeyStore, UserKeyCodec

    assert settings.data_keys_url is not None
    store = DataKeyStore(
        keyring,
        settings.data_keys_url.get_secret_value(),
        settings.data_keys_prefix or "mnemoflow:",
        cache_s=settings.data_keys_cache_s,
    )
    return UserKeyCodec(keyring, store, placeholders=placeholders)


def data_converter(settings: EncryptionSettings) -> DataConverter:
    """The pydantic converter, with the encryption codec when keys are configured."""
    if not settings.enabled:
        return pydantic_data_converter
    # Failure messages and stack traces can quote conversation text: move them into the
    # encoded attributes so the codec seals them too (the UI shows them through the codec).
    return dataclasses.replace(
        pydantic_data_converter,
        payload_codec=payload_codec(settings),
        failure_converter_class=DefaultFailureConverterWithEncodedAttributes,
    )
