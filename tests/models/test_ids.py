"""Workflow ids of users: readable in any script, unique, deterministic, and stable for ASCII."""

from __future__ import annotations

import hashlib
import random
import re
import string
import unicodedata

import pytest

from mnemoflow.models.ids import (
    SLUG_CHARS,
    pseudonymous_workflow_id,
    user_workflow_id,
    workflow_slug,
)

_OLD_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]+")


def old_workflow_id(user_id: str) -> str:
    """The formula every existing workflow id was made with (frozen copy, never edit)."""
    slug = _OLD_UNSAFE.sub("_", user_id[:40]).strip("_") or "user"
    return f"mnemoflow-user-{slug}-{hashlib.sha256(user_id.encode()).hexdigest()[:20]}"


def slug_of(workflow_id: str) -> str:
    return workflow_id.removeprefix("mnemoflow-user-").rsplit("-", 1)[0]


def test_ascii_ids_keep_exactly_their_old_workflow_ids() -> None:
    rng = random.Random(15)
    alphabet = string.printable + "\x7f"
    ids = ["ada", "ada@example.com", "a b/c", "___", "-x-", "user", "O'Brien", "a" * 500]
    ids += ["".join(rng.choices(alphabet, k=rng.randint(1, 90))) for _ in range(2000)]
    # Non-ASCII characters past the slug's head never reached the slug either.
    ids += ["x" * SLUG_CHARS + "张伟", "y" * SLUG_CHARS + "😀"]
    for user_id in ids:
        assert user_workflow_id(user_id) == old_workflow_id(user_id), repr(user_id)
    assert user_workflow_id("ada@example.com") == (
        "mnemoflow-user-ada@example.com-" + hashlib.sha256(b"ada@example.com").hexdigest()[:20]
    )


@pytest.mark.parametrize(
    ("user_id", "slug"),
    [
        ("张伟", "张伟"),
        ("王小明 (VIP)", "王小明_VIP"),
        ("Иван Петров", "Иван_Петров"),
        ("محمد علي", "محمد_علي"),
        ("हिन्दी", "हिन्दी"),  # combining vowel signs are kept: the word stays readable
        ("ｆｕｌｌｗｉｄｔｈ１２", "fullwidth12"),  # NFKC
        ("Zoë/Ünal", "Zoë_Ünal"),
        ("😀🎉", "user"),
        ("ana😀maría", "ana_maría"),
        ("客户-42@shop.cn", "客户-42@shop.cn"),
        ("x\u202eevil\u200b", "x_evil"),  # bidi override and zero-width space never shown
        ("tab\tnew\nline\"quote'", "tab_new_line_quote"),
    ],
)
def test_non_ascii_ids_keep_their_letters(user_id: str, slug: str) -> None:
    wid = user_workflow_id(user_id)
    assert slug_of(wid) == slug
    assert wid.endswith("-" + hashlib.sha256(user_id.encode()).hexdigest()[:20])
    assert user_workflow_id(user_id) == wid  # deterministic


def test_slugs_are_bounded_and_safe() -> None:
    for user_id in ["张" * 5000, "Я" * 4096, "😀" * 3000, "a\u0301" * 3000, "ي" * 4096]:
        slug = workflow_slug(user_id)
        assert 1 <= len(slug) <= SLUG_CHARS
        assert len(user_workflow_id(user_id).encode()) < 255
    for user_id in ["张 伟", "\u0000x", "a\\b", "日本/語", "a\u2028b"]:
        for char in workflow_slug(user_id):
            assert char in "_.@-" or unicodedata.category(char)[0] in "LMN", repr(char)


def test_ids_that_share_a_slug_still_get_distinct_workflow_ids() -> None:
    groups = [
        ["张 伟", "张/伟", "张_伟", "张\t伟"],
        ["ｆｕｌｌ", "full"],  # equal after NFKC, different ids
        ["😀", "🎉", "user"],
        ["张" * 60 + "a", "张" * 60 + "b"],  # differ only past the slug's head
    ]
    for group in groups:
        slugs = {workflow_slug(u) for u in group}
        assert len(slugs) == 1, group
        assert len({user_workflow_id(u) for u in group}) == len(group), group


def test_pseudonymous_ids_show_nothing_of_the_user_id() -> None:
    for user_id in ["张伟", "Иван", "ada@example.com"]:
        wid = pseudonymous_workflow_id(user_id)
        assert wid == "mnemoflow-user-" + hashlib.sha256(user_id.encode()).hexdigest()[:32]


def test_thread_key_keeps_short_ids_and_shortens_long_ones_deterministically() -> None:
    from mnemoflow.models.ids import MAX_THREAD_ID_CHARS, thread_key

    short = "t" * MAX_THREAD_ID_CHARS
    assert thread_key(short) == short and thread_key("t1") == "t1"
    a, b = "x" * 700 + "A", "x" * 700 + "B"
    assert thread_key(a) == thread_key(a) and thread_key(a) != thread_key(b)
    assert len(thread_key(a)) <= MAX_THREAD_ID_CHARS and thread_key(a).startswith("x" * 200)


def test_thread_key_of_an_id_with_a_lone_surrogate_is_encodable_and_distinct() -> None:
    from mnemoflow.models.ids import thread_key

    a, b = "t-\ud83d-x", "t-\ud83e-x"
    for key in (thread_key(a), thread_key(b), thread_key("y" * 300 + "\udc00")):
        key.encode("utf-8")  # never raises: a contract can carry it
    assert thread_key(a) == thread_key(a) != thread_key(b)
    assert thread_key(a).startswith("t-\ufffd-x~")
    assert thread_key("t-\U0001f99c-ok") == "t-\U0001f99c-ok"  # a whole emoji is kept as it is


def test_a_raw_id_never_takes_another_ids_hashed_search_value() -> None:
    from mnemoflow.models.ids import search_user_value, user_key

    quoted = "o'brien-x"  # unqueryable: falls back to its hash
    look_alike = "sha256-" + user_key(quoted)
    assert search_user_value(quoted) != search_user_value(look_alike)
    assert search_user_value(look_alike) == "sha256-" + user_key(look_alike)
    assert search_user_value("alice") == "alice"
