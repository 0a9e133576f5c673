"""The pure side of `MnemoflowStore` (middleware/store.py): how a LangGraph store item lives as a
remembered fragment, how namespaces name users, and the store's filters and namespace matching.

An item is one explicit fragment (docs/ARCHITECTURE.md, "Where things live": a remembered fact):
its content is the item's value as JSON, which the per-call search reads as text and `get` parses
back exactly, and its theme is `store:<key>`. Every put makes a new fragment and forgets the
older ones of the key, so a key that was deleted can be put again (a forgotten fragment id stays
forgotten for good in the user workflow). Readers take the newest fragment of a key, so an older
one that a failed clean-up left behind is never returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langgraph.store.base import InvalidNamespaceError, MatchCondition

from mnemoflow.models.corpus import CorpusEntry

#: The theme of an item's fragment is this prefix and the key.
STORE_THEME_PREFIX = "store:"
#: The theme holds at most 200 characters (RememberRequest), the prefix included.
MAX_KEY_CHARS = 200 - len(STORE_THEME_PREFIX)
#: A value's JSON is remembered whole and never cut (MemoryClient.remember's bound).
MAX_VALUE_CHARS = 8000
USER_FIELD = "{user_id}"


class NamespaceTemplate:
    """A namespace template such as `("memories", "{user_id}")`: fixed labels and one user."""

    def __init__(self, template: Sequence[str]) -> None:
        parts = tuple(template) if not isinstance(template, str) else (template,)
        if parts.count(USER_FIELD) != 1:
            raise ValueError(
                f"the namespace template must hold {USER_FIELD!r} exactly once, got {parts!r}"
            )
        for part in parts:
            if part != USER_FIELD and (not part or "{" in part or "}" in part or "." in part):
                raise ValueError(
                    f"label {part!r} of the namespace template {parts!r} must be a plain "
                    f"non-empty label without '.', or {USER_FIELD!r}"
                )
        self.parts = parts
        self.at = parts.index(USER_FIELD)

    def user_of(self, namespace: Sequence[str]) -> str:
        """The user a namespace names; InvalidNamespaceError when it does not match."""
        ns = tuple(namespace)
        if len(ns) != len(self.parts) or any(
            p != USER_FIELD and p != n for p, n in zip(self.parts, ns, strict=True)
        ):
            raise InvalidNamespaceError(
                f"namespace {ns!r} does not match this store's template {self.parts!r}: "
                "every namespace names one user, e.g. "
                f"{self.namespace_of('alice')!r}"
            )
        return ns[self.at]

    def namespace_of(self, user_id: str) -> tuple[str, ...]:
        """The namespace of a user."""
        return tuple(user_id if p == USER_FIELD else p for p in self.parts)


def store_theme(key: str) -> str:
    """The theme of an item's fragment; ValueError for a key that cannot be one."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"a store key is a non-empty str, got {key!r:.80}")
    if len(key) > MAX_KEY_CHARS:
        raise ValueError(f"a store key holds at most {MAX_KEY_CHARS} characters, got {len(key)}")
    return f"{STORE_THEME_PREFIX}{key}"


def _str_keys(value: Any, path: str = "value") -> None:
    """JSON would turn a key 1 into "1" silently, and `get` must return what was put."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"a store value must be plain JSON: {path} has the key {k!r}")
            _str_keys(v, f"{path}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _str_keys(v, f"{path}[{i}]")


def encode_value(value: Any) -> str:
    """The JSON a value is remembered as; ValueError naming what is wrong."""
    if not isinstance(value, Mapping):
        raise ValueError(f"a store value is a JSON object (a dict), got {type(value).__name__}")
    _str_keys(value)
    try:
        text = json.dumps(dict(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"a store value must be plain JSON: {err}") from err
    if len(text) > MAX_VALUE_CHARS:
        raise ValueError(
            f"a store value is at most {MAX_VALUE_CHARS} characters of JSON, got {len(text)} "
            "(one item is one memory: split it into several keys)"
        )
    return text


def decode_value(content: str) -> dict[str, Any] | None:
    """The value a fragment holds, or None when the fragment is not a store item."""
    try:
        value = json.loads(content)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class StoredVersion:
    """One fragment of a key: its id, when the user workflow stored it, and the value."""

    fragment_id: str
    created_at: float
    value: dict[str, Any]


@dataclass
class UserItems:
    """A user's items as Milvus holds them, every stored version of each key."""

    versions: dict[str, list[StoredVersion]] = field(default_factory=dict)
    entries: dict[str, CorpusEntry] = field(default_factory=dict)

    def current(self, key: str) -> StoredVersion | None:
        """The newest version of a key (None: no such item)."""
        found = self.versions.get(key)
        return found[-1] if found else None

    def key_of(self, fragment_id: str) -> str | None:
        """The key of a current version's fragment (None for an older version or another)."""
        entry = self.entries.get(fragment_id)
        if entry is None:
            return None
        key = entry.theme[len(STORE_THEME_PREFIX) :]
        current = self.current(key)
        return key if current is not None and current.fragment_id == fragment_id else None


def user_items(entries: Iterable[CorpusEntry]) -> UserItems:
    """The store items among a user's corpus entries (conversation fragments and other
    remembered facts are left out), each key's versions oldest first."""
    items = UserItems()
    for entry in entries:
        if not entry.theme.startswith(STORE_THEME_PREFIX):
            continue
        value = decode_value(entry.content)
        key = entry.theme[len(STORE_THEME_PREFIX) :]
        if value is None or not key:
            continue
        items.entries[entry.id] = entry
        items.versions.setdefault(key, []).append(StoredVersion(entry.id, entry.created_at, value))
    for versions in items.versions.values():
        versions.sort(key=lambda v: (v.created_at, v.fragment_id))
    return items


# --- filters --------------------------------------------------------------------------------

_ORDERED = {"$gt": float.__gt__, "$gte": float.__ge__, "$lt": float.__lt__, "$lte": float.__le__}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _operator(found: Any, op: str, wanted: Any) -> bool:
    if op == "$eq":
        return bool(found == wanted)
    if op == "$ne":
        return bool(found != wanted)
    if op in _ORDERED:
        a, b = _number(found), _number(wanted)
        return a is not None and b is not None and _ORDERED[op](a, b)
    raise ValueError(f"unknown filter operator {op!r}: use $eq, $ne, $gt, $gte, $lt or $lte")


def _field(value: Mapping[str, Any], path: str) -> Any:
    """A field of a value; a dotted path reaches into nested objects."""
    if path in value:
        return value[path]
    current: Any = value
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def _matches(found: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if wanted and all(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(found, op, arg) for op, arg in wanted.items())
        return isinstance(found, Mapping) and all(
            _matches(found.get(k), v) for k, v in wanted.items()
        )
    return bool(found == wanted)


def matches_filter(value: Mapping[str, Any], where: Mapping[str, Any] | None) -> bool:
    """Whether a value passes a store filter: every field equal to the filter's value, or
    meeting its operators (`{"score": {"$gte": 3}}`); nested objects match field by field."""
    return all(_matches(_field(value, k), v) for k, v in (where or {}).items())


# --- namespace listing ----------------------------------------------------------------------


def _fits(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    if not path:
        return True
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


def list_namespaces(
    namespaces: Iterable[tuple[str, ...]],
    conditions: Sequence[MatchCondition] | None,
    max_depth: int | None,
    limit: int,
    offset: int,
) -> list[tuple[str, ...]]:
    """The namespaces that meet every condition, cut to `max_depth`, sorted, one page."""
    kept = {
        ns[:max_depth] if max_depth is not None else ns
        for ns in namespaces
        if all(_fits(ns, c) for c in conditions or ())
    }
    return sorted(kept)[offset : offset + limit]
