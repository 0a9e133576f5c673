"""MnemoflowStore: LangGraph's `BaseStore` over a `MemoryClient` (README.md, "Already using a
LangGraph store?").

- A namespace names one user through a template (`("memories", "{user_id}")`); any other
  namespace is an InvalidNamespaceError.
- `put` is `MemoryClient.remember`: durable in Milvus when it returns,
  published to the user's injected context at once, never waiting for a round. The value's JSON
  is the fragment's content and `store:<key>` its theme (middleware/store_items.py). A put makes a
  new fragment, then forgets the key's older ones (`forget_fragment`): overwriting a key, or
  putting it again after a delete, never brings back a forgotten fragment id.
- `delete` (and `put(value=None)`) is `forget_fragment` of every fragment of the key, with the
  same guarantees (docs/ARCHITECTURE.md, "Forget leaves nothing to resurrect").
- `get` and `search` read the user's store items from the fragment collection in Milvus (only
  the rows whose theme is a store key, strongly consistent: every put is there when it
  returns), again only when the user's corpus version moved; `search` with a query ranks the
  items with the per-call search (`memory.search`:
  BM25 and cosine fused, then the memory formula), without one it lists the newest first.
- `list_namespaces` lists the users whose memory workflows run on the client's task queue
  (Temporal visibility, which follows a new user within about a second).
- TTL is refused: memory is forgotten explicitly, never by a timer.

Failures are raised, never swallowed: MemoryUnavailableError when memory does not answer, and
ValueError (InvalidInputError, InvalidNamespaceError) for a bad namespace, key or value.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)

from mnemoflow.memory.search import SearchIndex
from mnemoflow.middleware.client import MemoryClient
from mnemoflow.middleware.search import build_index
from mnemoflow.middleware.store_items import (
    STORE_THEME_PREFIX,
    NamespaceTemplate,
    StoredVersion,
    UserItems,
    encode_value,
    list_namespaces,
    matches_filter,
    store_theme,
    user_items,
)
from mnemoflow.models import search_attributes as sa
from mnemoflow.models.errors import InvalidInputError, MemoryUnavailableError
from mnemoflow.models.ids import search_user_value, validate_user_id

log = logging.getLogger(__name__)

#: What LangMem and LangGraph's own examples use.
DEFAULT_NAMESPACE = ("memories", "{user_id}")
#: Users whose items are kept parsed in process (least recently read dropped first).
MAX_CACHED_USERS = 256


def _time(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


class MnemoflowStore(BaseStore):
    """A LangGraph store whose items are a user's durable, forgettable memories."""

    supports_ttl = False

    def __init__(
        self,
        client: MemoryClient,
        *,
        namespace: Sequence[str] = DEFAULT_NAMESPACE,
        types: Sequence[str] = ("fact",),
        ttl: TTLConfig | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        """`namespace` is the template naming a user; `types` the fragment types an item gets
        (its weight in the memory formula). The store's sync methods run on `loop` (default:
        the loop running now), the client's loop, from another thread."""
        if ttl is not None:
            raise NotImplementedError(
                "MnemoflowStore does not expire items (TTL): memory is forgotten explicitly, "
                "with delete (forget_fragment) or MemoryClient.forget"
            )
        if client.searcher is None:
            raise ValueError(
                "MnemoflowStore needs a MemoryClient built with milvus_uri: get and search "
                "read the user's items from the fragment collection"
            )
        self.client = client
        self.template = NamespaceTemplate(namespace)
        self.types = list(types)
        if loop is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
        self.loop = loop
        self._cache: dict[str, tuple[int, UserItems, SearchIndex | None]] = {}

    # --- BaseStore ------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """The ops run on the client's event loop; call from another thread (a sync tool)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            raise RuntimeError(
                "MnemoflowStore's sync methods need the event loop of its MemoryClient: build "
                "the store inside that loop (or pass loop=...), or use the async methods"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError(
                "a sync MnemoflowStore method was called on its own event loop, which would "
                "block it: use the async method (aget, aput, asearch, adelete)"
            )
        return asyncio.run_coroutine_threadsafe(self.abatch(ops), loop).result()

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """The ops one after another, in order (a get after a put of the batch sees it)."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(await self._get(op))
            elif isinstance(op, PutOp):
                await self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(await self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(await self._list(op))
            else:
                raise TypeError(f"unknown store operation {type(op).__name__}")
        return results

    # --- operations -----------------------------------------------------------------------

    def _user(self, namespace: Sequence[str]) -> str:
        user = self.template.user_of(namespace)
        return validate_user_id(user)

    def _item(self, namespace: tuple[str, ...], key: str, version: StoredVersion) -> Item:
        at = _time(version.created_at)
        return Item(value=version.value, key=key, namespace=namespace, created_at=at, updated_at=at)

    async def _get(self, op: GetOp) -> Item | None:
        user = self._user(op.namespace)
        items, _ = await self._items(user)
        version = items.current(op.key)
        return None if version is None else self._item(tuple(op.namespace), op.key, version)

    async def _put(self, op: PutOp) -> None:
        if op.ttl is not None:
            raise NotImplementedError("MnemoflowStore does not expire items: pass ttl=None")
        user = self._user(op.namespace)
        theme = store_theme(op.key)
        if op.value is None:
            await self._forget(user, op.key, keep=None)
            return
        try:
            content = encode_value(op.value)
        except ValueError as err:
            raise InvalidInputError(str(err)) from err
        # A new fragment every time: an id once forgotten stays forgotten (store_items).
        result = await self.client.remember(
            user, content, theme=theme, types=self.types, event_id=f"store-{uuid.uuid4().hex}"
        )
        await self._forget(user, op.key, keep=result.fragment_id)

    async def _forget(self, user: str, key: str, *, keep: str | None) -> None:
        """After a put of `keep`: forget every fragment of the key but the newest. After a
        delete (`keep` None): forget all of them.

        Two puts of one key at once (two processes) each read the corpus after their own
        fragment is in it, so at least one of them sees both and forgets the older: the newest
        put wins, as readers already take it, and no stale value stays in the injected context.
        """
        items, _ = await self._items(user, fresh=True)
        versions = items.versions.get(key, [])
        drop = versions
        if keep is not None:
            if any(v.fragment_id == keep for v in versions):
                drop = versions[:-1]  # oldest first: all but the newest
            else:
                # The read did not see the new fragment (a Milvus read that missed a fresh
                # row): an older version would be read in its place, so all of them go.
                log.warning("a store put was not read back from Milvus; older versions forgotten")
                drop = [v for v in versions if v.fragment_id != keep]
        for version in drop:
            await self.client.forget_fragment(user, version.fragment_id)
        self._cache.pop(user, None)

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        namespace = tuple(op.namespace_prefix)
        user = self._user(namespace)
        if op.limit < 0 or op.offset < 0:
            raise InvalidInputError("search limit and offset must be >= 0")
        items, index = await self._items(user, with_index=bool(op.query))
        found: list[tuple[str, StoredVersion, float | None]] = []
        if op.query and index is not None:
            vector = await self._embed(op.query)
            ranked = await asyncio.to_thread(
                index.search, op.query, vector, self.client.config, datetime.now(UTC).timestamp()
            )
            for fragment in ranked:
                key = items.key_of(fragment.id)
                version = None if key is None else items.current(key)
                if key is not None and version is not None:
                    found.append((key, version, fragment.score))
        else:
            newest = sorted(
                ((k, v[-1]) for k, v in items.versions.items()),
                key=lambda kv: (kv[1].created_at, kv[1].fragment_id),
                reverse=True,
            )
            found = [(k, v, None) for k, v in newest]
        kept = [f for f in found if matches_filter(f[1].value, op.filter)]
        page = kept[op.offset : op.offset + op.limit]
        return [
            SearchItem(
                namespace, key, v.value, _time(v.created_at), _time(v.created_at), score=score
            )
            for key, v, score in page
        ]

    async def _list(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        if self.client._secret is not None:
            raise NotImplementedError(
                "list_namespaces cannot name users when user keys are pseudonymous: Temporal "
                "only holds their hashes"
            )
        query = f"WorkflowType = 'UserMemoryWorkflow' AND TaskQueue = '{self.client.task_queue}'"
        users: set[str] = set()
        try:
            async for execution in self.client.temporal.list_workflows(query):
                value = execution.typed_search_attributes.get(sa.USER)
                if value and search_user_value(value) == value:
                    users.add(value)
        except Exception as err:
            raise MemoryUnavailableError(f"cannot list the users: {err!r}") from err
        namespaces = []
        for user in users:
            ns = self.template.namespace_of(user)
            if all(label and "." not in label for label in ns):  # LangGraph's label rule
                namespaces.append(ns)
        return list_namespaces(namespaces, op.match_conditions, op.max_depth, op.limit, op.offset)

    # --- reading the corpus ---------------------------------------------------------------

    async def _embed(self, query: str) -> Sequence[float] | None:
        embeddings = self.client.searcher.embeddings if self.client.searcher else None
        if embeddings is None:
            return None
        return await asyncio.to_thread(embeddings.embed_query, query)

    async def _items(
        self, user: str, *, fresh: bool = False, with_index: bool = False
    ) -> tuple[UserItems, SearchIndex | None]:
        """The user's items (and their search index), read again only when the corpus
        version moved (`fresh`: always)."""
        searcher = self.client.searcher
        assert searcher is not None  # checked in __init__
        try:
            async with asyncio.timeout(self.client.query_timeout_s):
                version = await searcher.version(user)
                cached = self._cache.get(user)
                if cached is not None and cached[0] == version and version and not fresh:
                    items, index = cached[1], cached[2]
                    entries = None
                else:
                    entries = await searcher.themed_entries(user, STORE_THEME_PREFIX)
        except Exception as err:  # Redis or Milvus down or slow: memory cannot answer
            raise MemoryUnavailableError(f"cannot read the user's store items: {err!r}") from err
        if entries is not None:
            items, index = user_items(entries), None
        if with_index and index is None:
            raw_items = {e.id: e.model_dump_json() for e in items.entries.values()}
            index = await asyncio.to_thread(build_index, raw_items, version)
        self._cache[user] = (version, items, index)
        while len(self._cache) > MAX_CACHED_USERS:
            self._cache.pop(next(iter(self._cache)))
        return items, index
