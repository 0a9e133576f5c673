"""The pure side of MnemoflowStore (middleware/store_items.py): namespace templates, how a value
is stored and read back, which corpus entries are items, filters and namespace listing."""

from __future__ import annotations

import json

import pytest
from langgraph.store.base import InvalidNamespaceError, MatchCondition

from mnemoflow.middleware.store_items import (
    MAX_KEY_CHARS,
    NamespaceTemplate,
    decode_value,
    encode_value,
    list_namespaces,
    matches_filter,
    store_theme,
    user_items,
)
from mnemoflow.models.corpus import CorpusEntry


def test_a_template_maps_namespaces_to_users_and_back() -> None:
    template = NamespaceTemplate(("app", "{user_id}", "memories"))
    assert template.user_of(("app", "阿达", "memories")) == "阿达"
    assert template.namespace_of("bo") == ("app", "bo", "memories")
    for wrong in [("app", "bo"), ("app", "bo", "notes"), ("x", "bo", "memories"), ()]:
        with pytest.raises(InvalidNamespaceError, match="does not match"):
            template.user_of(wrong)
    for bad in [
        ("memories",),
        ("{user_id}", "{user_id}"),
        ("a.b", "{user_id}"),
        ("{x}", "{user_id}"),
    ]:
        with pytest.raises(ValueError):
            NamespaceTemplate(bad)


def test_values_are_stored_as_json_and_read_back_exactly() -> None:
    value = {"a": 1, "b": 0.1 + 0.2, "c": [None, True, "中文 ✓"], "d": {"e": -1e-9}, "": ""}
    text = encode_value(value)
    assert decode_value(text) == value and list(json.loads(text)) == list(value)
    assert "中文" in text  # readable in the injected context, not \\u escapes
    for bad, match in [
        ({"s": {1}}, "plain JSON"),
        ({"x": float("inf")}, "plain JSON"),
        ([1, 2], "JSON object"),
        ({"b": object()}, "plain JSON"),
        ({"a": [{1: "x"}]}, "has the key 1"),  # JSON would make it "1" silently
        ({"t": "x" * 8000}, "at most"),
    ]:
        with pytest.raises(ValueError, match=match):
            encode_value(bad)
    assert decode_value("User: hello") is None and decode_value("[1, 2]") is None
    assert store_theme("k") == "store:k"
    for key in ["", "k" * (MAX_KEY_CHARS + 1)]:
        with pytest.raises(ValueError):
            store_theme(key)
    assert store_theme("k" * MAX_KEY_CHARS) == "store:" + "k" * MAX_KEY_CHARS


def entry(fid: str, theme: str, content: str, at: float) -> CorpusEntry:
    return CorpusEntry(id=fid, theme=theme, types=["fact"], content=content, created_at=at)


def test_only_store_entries_are_items_and_the_newest_version_wins() -> None:
    items = user_items(
        [
            entry("f2", "store:k", '{"v": 2}', 20.0),
            entry("f1", "store:k", '{"v": 1}', 10.0),
            entry("f3", "store:j", '{"v": 3}', 5.0),
            entry("c1", "orders", "User: my order is late", 1.0),  # conversation
            entry("c2", "store:x", "User: not JSON", 1.0),  # a theme alone is not an item
            entry("c3", "remembered", '{"v": 4}', 1.0),  # a remembered fact, not the store's
        ]
    )
    assert set(items.versions) == {"k", "j"}
    assert items.current("k").value == {"v": 2}  # type: ignore[union-attr]
    assert [v.fragment_id for v in items.versions["k"]] == ["f1", "f2"]
    assert items.key_of("f2") == "k" and items.key_of("f1") is None and items.key_of("c1") is None
    assert items.current("missing") is None


def test_filters_match_fields_operators_and_nested_objects() -> None:
    value = {"kind": "order", "n": 5, "tags": ["a", "b"], "meta": {"lang": "zh", "v": 2}}
    assert matches_filter(value, None) and matches_filter(value, {})
    assert matches_filter(value, {"kind": "order", "n": 5})
    assert not matches_filter(value, {"kind": "order", "n": 6})
    assert matches_filter(value, {"n": {"$gt": 4, "$lte": 5}})
    assert not matches_filter(value, {"n": {"$lt": 5}})
    assert matches_filter(value, {"kind": {"$ne": "taste"}})
    assert not matches_filter(value, {"kind": {"$ne": "order"}})
    assert matches_filter(value, {"tags": ["a", "b"]}) and not matches_filter(
        value, {"tags": ["a"]}
    )
    assert matches_filter(value, {"meta": {"lang": "zh"}})
    assert matches_filter(value, {"meta.v": {"$gte": 2}})
    assert not matches_filter(value, {"missing": "x"})
    assert not matches_filter(value, {"kind": {"$gt": 1}})  # a str is not ordered against 1
    with pytest.raises(ValueError, match="unknown filter operator"):
        matches_filter(value, {"n": {"$in": [5]}})


def test_namespace_listing_matches_cuts_and_pages() -> None:
    spaces = [("app", u, "memories") for u in ("bo", "ada", "cy")]
    prefix = MatchCondition(match_type="prefix", path=("app",))
    assert list_namespaces(spaces, [prefix], None, 100, 0) == sorted(spaces)
    wildcard = MatchCondition(match_type="prefix", path=("app", "*", "memories"))
    assert list_namespaces(spaces, [wildcard], None, 100, 0) == sorted(spaces)
    suffix = MatchCondition(match_type="suffix", path=("ada", "memories"))
    assert list_namespaces(spaces, [suffix], None, 100, 0) == [("app", "ada", "memories")]
    none = MatchCondition(match_type="prefix", path=("elsewhere",))
    assert list_namespaces(spaces, [prefix, none], None, 100, 0) == []
    assert list_namespaces(spaces, None, 2, 100, 0) == [
        ("app", "ada"),
        ("app", "bo"),
        ("app", "cy"),
    ]
    assert list_namespaces(spaces, None, 1, 100, 0) == [("app",)]
    assert list_namespaces(spaces, None, None, 2, 1) == sorted(spaces)[1:3]
