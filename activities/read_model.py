"""The read model in Redis: each user's injected context, as one JSON value the hot path GETs.

Key: `models.ids.context_key` (a hash of the user id, never the raw id); value: the context's
JSON, decoded by `models.contracts.parse_published` here and on the hot path. Redis holds nothing
that cannot be rebuilt from the user workflow, so it is a cache with one rule: a publish never
replaces a newer `version` with an older one (a slow, retried activity of an earlier round must
not clobber the context a later round already published). The comparison and the write happen
in one Lua script, atomically on the server.

The redis client is built without its own retries (`retry=None`): Temporal's retry policy is
the only retry mechanism, and the hot path prefers a fast miss to a slow hit.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

# redis-py's ConnectionPool.__del__ imports this module the first time a pool that still lists
# connections is collected; loaded here, that finalizer never takes a module lock, so a
# collection landing inside the workflow sandbox's imports (a new workflow run, a Worker's
# validation) cannot fail them (docs/ARCHITECTURE.md, "The worker process and its roles").
import redis.observability.recorder  # noqa: F401
from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.store_epochs import ADVANCE_LUA
from mnemoflow.activities.theme_weights import weights_key
from mnemoflow.models.contracts import (
    ActivityName,
    ContextFragment,
    DeleteReadModelInput,
    DeleteReadModelOutput,
    InjectedContext,
    PublishInput,
    PublishOutput,
    fill_stubs,
    is_stub,
    parse_published,
)
from mnemoflow.models.errors import InvalidInputError, PayloadTooLargeError
from mnemoflow.models.ids import context_key, epoch_key, validate_user_id

if TYPE_CHECKING:  # the hot path's processes import this module without Milvus
    from mnemoflow.activities.fragment_store import FragmentStore

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "mnemoflow:"
# The hot path reads this on every model call; a context this large is a bug upstream.
DEFAULT_MAX_BYTES = 1_000_000

# KEYS[1] = context key, KEYS[2] = the user's forget epoch key; ARGV[1] = new JSON, ARGV[2] = its
# version, ARGV[3] = its forget epoch. Returns {1, version} when written, {0, stored version} when
# a newer one is already there, {2, recorded epoch} when the user was forgotten after the context
# was made (docs/ARCHITECTURE.md, "Forget epochs"). A written context keeps the epoch key at
# least at its epoch (agents read it), and writes it at 0 when it is absent. An unreadable
# stored value counts as absent: the read model is rebuildable, never authoritative.
_PUBLISH_LUA = """
local raw = redis.call('GET', KEYS[2])
local recorded = tonumber(raw or '0') or 0
local epoch = tonumber(ARGV[3])
if recorded > epoch then
  return {2, recorded}
end
if epoch > recorded or not raw then
  redis.call('SET', KEYS[2], ARGV[3])
end
local current = redis.call('GET', KEYS[1])
if current then
  local ok, doc = pcall(cjson.decode, current)
  if ok and type(doc) == 'table' and tonumber(doc['version']) then
    local stored = tonumber(doc['version'])
    if stored > tonumber(ARGV[2]) then
      return {0, stored}
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1])
return {1, tonumber(ARGV[2])}
"""


class ReadModel:
    """Publish and read injected contexts; one instance per process, over redis.asyncio."""

    def __init__(
        self,
        redis: str | aioredis.Redis,
        prefix: str = DEFAULT_PREFIX,
        *,
        timeout_s: float = 2.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        """`redis` is a URL (a client is built with timeouts and no retries) or a client."""
        if isinstance(redis, str):
            redis = aioredis.Redis.from_url(
                redis, retry=None, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        self._redis = redis
        self.prefix = prefix
        self.max_bytes = max_bytes
        self._publish_script = redis.register_script(_PUBLISH_LUA)
        self._advance_script = redis.register_script(ADVANCE_LUA)

    @classmethod
    def from_url(
        cls,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        *,
        timeout_s: float = 2.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> ReadModel:
        """A read model on a new client for `url` (same as passing the URL to the constructor)."""
        return cls(url, prefix, timeout_s=timeout_s, max_bytes=max_bytes)

    @property
    def redis(self) -> aioredis.Redis:
        """The client, shared with the corpus versions (closed by `close`)."""
        return self._redis

    async def close(self) -> None:
        """Close the client's connections."""
        await self._redis.aclose()

    def key(self, user_id: str) -> str:
        """The Redis key of a user's context (InvalidInputError for an unusable user id)."""
        try:
            uid = validate_user_id(user_id)
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from exc
        return context_key(self.prefix, uid)

    async def publish(self, context: InjectedContext) -> PublishOutput:
        """Store the context unless a newer version is already there."""
        key = self.key(context.user_id)
        if any(is_stub(f) for f in context.fragments):  # never published: see ReadModelActivities
            context = context.model_copy(
                update={"fragments": [f for f in context.fragments if not is_stub(f)]}
            )
        payload = context.model_dump_json().encode("utf-8")
        whole = len(payload)
        kept = list(context.fragments)
        while len(payload) > self.max_bytes and kept:
            # Long fragments (up to 60 KB each) can pass the bound together: the lowest ranked
            # go first. They stay in Milvus and in the per-call search; only this copy is cut.
            kept.pop()
            payload = context.model_copy(update={"fragments": kept}).model_dump_json().encode()
        if len(payload) > self.max_bytes:
            raise PayloadTooLargeError(
                f"injected context is {len(payload)} bytes without any fragment; the read model"
                f" takes {self.max_bytes}"
            )
        if len(payload) < whole:
            log.warning(
                "read model of a user kept %d of %d context fragments (%d of %d bytes)",
                len(kept),
                len(context.fragments),
                len(payload),
                whole,
            )
        written, stored = await self._publish_script(
            keys=[key, epoch_key(self.prefix, context.user_id)],
            args=[payload, context.version, context.forget_epoch],
        )
        if written == 2:
            log.warning(
                "a context of forget epoch %s refused: the user was forgotten since (epoch %s)",
                context.forget_epoch,
                stored,
            )
        elif not written:
            log.info("read model kept newer version %s over %s", stored, context.version)
        return PublishOutput(key=key, bytes=len(payload))

    async def get(self, user_id: str) -> InjectedContext | None:
        """The user's published context (one GET), or None if absent or unreadable."""
        raw = await self._redis.get(self.key(user_id))
        try:
            return parse_published(raw)
        except ValueError:
            log.warning("unreadable read-model value for a user; treating it as absent")
            return None

    async def delete(self, user_id: str, epoch: int | None = None) -> int:
        """Remove the user's context and tuned weights (activities/theme_weights.py); returns
        the number of context keys deleted (0 or 1). `epoch`: the forget's epoch, which the
        user's epoch key is moved to first (a publish of an older one is refused from then on,
        and agents stamp the new one)."""
        key = self.key(user_id)
        if epoch is not None:
            await self._advance_script(keys=[epoch_key(self.prefix, user_id)], args=[epoch])
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(weights_key(self.prefix, user_id))
            pipe.delete(key)
            _, deleted = await pipe.execute()
        return int(deleted)


class ReadModelActivities:
    """The publish activity, bound to one ReadModel (and the fragment store, which fills the
    fragments a context names by id only)."""

    def __init__(self, read_model: ReadModel, store: FragmentStore | None = None) -> None:
        self.read_model = read_model
        self.store = store

    @activity.defn(name=ActivityName.PUBLISH)
    async def publish(self, inp: PublishInput) -> PublishOutput:
        """Write the user's injected context; too big or invalid fails without retries."""
        try:
            whole = await self.filled(inp.context)
            out = await self.read_model.publish(whole)
        except (InvalidInputError, PayloadTooLargeError) as exc:
            # Permanent: retrying cannot shrink the payload or fix the user id.
            raise ApplicationError(str(exc), type=exc.type, non_retryable=True) from exc
        if not inp.contents_top:
            return out
        stubs = {f.id for f in inp.context.fragments if is_stub(f)}
        top = whole.fragments[: inp.contents_top]
        return out.model_copy(update={"filled": [f for f in top if f.id in stubs]})

    async def filled(self, context: InjectedContext) -> InjectedContext:
        """The context with its stubs (`models.contracts.stub_fragment`, shape 4) filled: from
        the context Redis holds (the last round published them whole), else from the fragment
        store. A stub found in neither was forgotten meanwhile and stays out; one the store
        cannot be asked for now (Milvus down) stays out of this publish only, which is a cache
        write: the user workflow still names it, and its next publish tries again."""
        stubs = [f.id for f in context.fragments if is_stub(f)]
        if not stubs:
            return context
        found: dict[str, ContextFragment] = {}
        published = await self.read_model.get(context.user_id)
        if published is not None:
            found.update({f.id: f for f in published.fragments if not is_stub(f)})
        missing = [fid for fid in stubs if fid not in found]
        if missing and self.store is not None:
            try:
                for fragment in await self.store.get(context.user_id, missing):
                    found[fragment.id] = ContextFragment.of(fragment)
            except Exception as exc:  # a cache write: publish what is at hand
                log.warning("fragment store unavailable to fill %d stubs: %s", len(missing), exc)
        fragments = fill_stubs(context.fragments, found, keep_unfound=False)
        return context.model_copy(update={"fragments": fragments})

    @activity.defn(name=ActivityName.DELETE_READ_MODEL)
    async def delete_read_model(self, inp: DeleteReadModelInput) -> DeleteReadModelOutput:
        """Remove the user's read model (part of forgetting the user); idempotent."""
        try:
            return DeleteReadModelOutput(
                deleted=await self.read_model.delete(inp.user_id, epoch=inp.epoch)
            )
        except InvalidInputError as exc:
            raise ApplicationError(str(exc), type=exc.type, non_retryable=True) from exc
