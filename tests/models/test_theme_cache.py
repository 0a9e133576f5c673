"""Shape 4's compact theme cache (models.round_store.pack_theme_cache): what a round's input
carries of the user's tuned weights, 21 bytes a theme."""

from __future__ import annotations

import random
import struct

import pytest

from mnemoflow.models.fragments import FragmentDraft, theme_key
from mnemoflow.models.params import TunedParams
from mnemoflow.models.round_store import (
    MAX_TUNED_THEMES,
    cached_params,
    pack_params,
    pack_theme_cache,
    theme_ref,
    tune_requests,
    unpack_theme_cache,
)


def _random_params(rng: random.Random) -> TunedParams:
    a, b, g = (rng.random() for _ in range(3))
    total = a + b + g
    return TunedParams(
        alpha=a / total,
        beta=b / total,
        gamma=g / total,
        delta=rng.uniform(-0.2, 0.2),
        w0=rng.random() / 3,
        w1=rng.random() / 3,
        w2=rng.random() / 3,
    )


def _themes(n: int, rng: random.Random) -> dict[str, TunedParams]:
    names = [f"theme {i} {rng.choice(['travel', 'Work', '家人', 'santé'])}" for i in range(n)]
    return {theme_key(name): _random_params(rng) for name in names}


def test_every_theme_comes_back_by_its_key_to_half_precision() -> None:
    rng = random.Random(7)
    tuned = _themes(MAX_TUNED_THEMES, rng)
    cache = unpack_theme_cache(pack_theme_cache(tuned))
    assert len(cache) == len(tuned)
    for key, params in tuned.items():
        got = cached_params(cache, key)
        assert got is not None, key
        assert got.model_dump() == pytest.approx(params.model_dump(), rel=1e-3, abs=1e-4)
    assert cached_params(cache, "a theme never tuned") is None
    assert unpack_theme_cache(pack_theme_cache({})) == {}


def test_a_full_cache_is_under_half_the_shape_3_packing() -> None:
    tuned = _themes(MAX_TUNED_THEMES, random.Random(3))
    compact = len(pack_theme_cache(tuned))
    assert compact == 28 * MAX_TUNED_THEMES  # base64 of 21 bytes a theme
    import json

    shape3 = len(json.dumps({k: pack_params(p, 6) for k, p in tuned.items()}))
    assert compact * 2 < shape3, (compact, shape3)


def test_no_theme_key_is_mistaken_for_a_reference() -> None:
    # theme_key strips leading whitespace, and a reference starts with a space.
    for theme in [" 00e13ed7", "\t00e13ed7", "00e13ed7", "#00e13ed7"]:
        assert not theme_key(theme).startswith(" ")
    assert theme_ref("work").startswith(" ") and len(theme_ref("work")) == 1 + 2 * 7


def test_cached_themes_are_not_tuned_again_by_reference() -> None:
    drafts = [
        FragmentDraft(theme=t, types=["fact"], content=f"line about {t}", start_idx=0, end_idx=0)
        for t in ["Travel", "work", "Family"]
    ]
    cache = unpack_theme_cache(pack_theme_cache({"travel": TunedParams()}))
    assert [k for k, _ in tune_requests(drafts, cache)] == ["work", "family"]
    assert [k for k, _ in tune_requests(drafts, {"work": TunedParams()})] == ["travel", "family"]


def test_themes_whose_references_collide_are_both_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two themes sharing a reference (a digest collision, made here by shortening the
    digest) are both sent as not cached: each is tuned again, never scored with the other's
    weights."""
    from mnemoflow.models import round_store

    monkeypatch.setattr(round_store, "THEME_DIGEST_BYTES", 1)
    monkeypatch.setattr(round_store, "_THEME_ENTRY", struct.Struct("<1s7e"))
    names = [f"theme {i}" for i in range(40)]
    refs = [round_store.theme_ref(n) for n in names]
    a, b = next(
        (x, y)
        for i, x in enumerate(names)
        for y in names[i + 1 :]
        if refs[names.index(x)] == refs[names.index(y)]
    )
    other = next(n for n in names if refs.count(refs[names.index(n)]) == 1)
    tuned = {
        a: TunedParams(alpha=0.9, beta=0.05, gamma=0.05),
        b: TunedParams(),
        other: TunedParams(),
    }
    cache = round_store.unpack_theme_cache(round_store.pack_theme_cache(tuned))
    assert cached_params(cache, a) is None and cached_params(cache, b) is None
    assert cached_params(cache, other) is not None
    drafts = [
        FragmentDraft(theme=t, types=["fact"], content=f"about {t}", start_idx=0, end_idx=0)
        for t in (a, b)
    ]
    assert [k for k, _ in tune_requests(drafts, cache)] == [a, b]
