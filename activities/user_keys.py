"""The forget saga's last store step: erase the user's data keys (crypto-shredding).

The keys themselves are made and used by the payload codec (`worker.data_keys`); this activity
only deletes the Redis hash that holds them (`models.ids.data_key_name`), so it needs no key
material. Once it returned, no payload of the user sealed before can be decrypted: not by the
codec server, not by a worker replaying a history, not from a copy of Temporal's database.
Idempotent: a retry finds nothing left and reports 0.
"""

from __future__ import annotations

from collections.abc import Callable

import redis.asyncio as aioredis
from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.models.errors import InvalidInputError
from mnemoflow.models.ids import data_key_name, data_key_user, validate_user_id
from mnemoflow.models.user_keys import DESTROY_USER_KEY, DestroyUserKeyInput, DestroyUserKeyOutput


class UserKeyActivities:
    """`destroy_user_key`, bound to the Redis of the data keys (None: per-user keys are off)."""

    def __init__(
        self,
        redis: aioredis.Redis | None,
        prefix: str = "mnemoflow:",
        on_destroyed: Callable[[str], None] | None = None,
    ) -> None:
        """`on_destroyed(data_key_user)` drops this process's cached copies of the keys (the
        payload codec's `forget_cached`), so this process stops using them at once; other
        processes ask Redis on every decode and stop at once too (docs/PRIVACY.md)."""
        self.redis = redis
        self.prefix = prefix
        self.on_destroyed = on_destroyed

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str,
        on_destroyed: Callable[[str], None] | None = None,
        *,
        timeout_s: float = 2.0,
    ) -> UserKeyActivities:
        """On a new client for `url`, without the client's own retries (Temporal retries)."""
        client = aioredis.Redis.from_url(
            url, retry=None, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        return cls(client, prefix, on_destroyed)

    async def close(self) -> None:
        """Close the client's connections."""
        if self.redis is not None:
            await self.redis.aclose()

    @activity.defn(name=DESTROY_USER_KEY)
    async def destroy_user_key(self, inp: DestroyUserKeyInput) -> DestroyUserKeyOutput:
        """Erase every generation of the user's data key; how many there were."""
        try:
            user_id = validate_user_id(inp.user_id)
        except ValueError as exc:
            err = InvalidInputError(str(exc))
            raise ApplicationError(str(err), type=err.type, non_retryable=True) from exc
        if self.redis is None:
            return DestroyUserKeyOutput(destroyed=0)
        data_user = data_key_user(user_id)
        name = data_key_name(self.prefix, data_user)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hkeys(name)
            pipe.delete(name)
            fields, _ = await pipe.execute()
        if self.on_destroyed is not None:
            self.on_destroyed(data_user)
        generations = [f for f in fields if (f.decode() if isinstance(f, bytes) else f)[:2] == "g:"]
        return DestroyUserKeyOutput(destroyed=len(generations))
