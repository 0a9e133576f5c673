"""Shape 5's tuned weights in Redis (activities/theme_weights.py), on a real redis-server."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis

from mnemoflow.activities.theme_weights import ThemeWeights, weights_key
from mnemoflow.devstack.processes import free_port
from mnemoflow.models.ids import user_key
from mnemoflow.models.params import TunedParams


@pytest.fixture
async def weights(redis_url: str):  # type: ignore[no-untyped-def]
    client = aioredis.Redis.from_url(redis_url)
    yield ThemeWeights(client, f"tw-{uuid.uuid4().hex[:6]}:")
    await client.aclose()


async def test_weights_come_back_per_user_and_theme(weights: ThemeWeights) -> None:
    travel = TunedParams(alpha=0.7, beta=0.1, gamma=0.2, delta=0.05, w0=0.2, w1=0.6, w2=0.2)
    work = TunedParams()
    await weights.put("ada", {"travel": travel, "work": work})
    await weights.put("bob", {"travel": work})
    got = await weights.get("ada", ["travel", "work", "cooking", "travel"])
    assert set(got) == {"travel", "work"}
    assert got["travel"].model_dump() == pytest.approx(travel.model_dump(), abs=1e-6)
    bob = (await weights.get("bob", ["travel"]))["travel"]
    assert bob.model_dump() == pytest.approx(work.model_dump(), abs=1e-6)
    assert await weights.get("carol", ["travel"]) == {}
    assert await weights.get("ada", []) == {}
    # No theme text and no raw user id in Redis.
    key = weights_key(weights.prefix, "ada")
    assert user_key("ada") in key and "ada" not in key.replace(user_key("ada"), "")
    fields = await weights._redis.hkeys(key)
    assert fields and not any(b"travel" in f or b"work" in f for f in fields)
    # Forgetting one user leaves the other's.
    assert await weights.delete("ada") == 1
    assert await weights.get("ada", ["travel", "work"]) == {}
    assert set(await weights.get("bob", ["travel"])) == {"travel"}


async def test_unreadable_value_or_unreachable_redis_is_a_miss(weights: ThemeWeights) -> None:
    await weights.put("ada", {"travel": TunedParams()})
    key = weights_key(weights.prefix, "ada")
    [field] = await weights._redis.hkeys(key)
    await weights._redis.hset(key, field, b"not json")
    assert await weights.get("ada", ["travel"]) == {}
    dead = aioredis.Redis.from_url(
        f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1, retry=None
    )
    try:
        assert await ThemeWeights(dead, "x:").get("ada", ["travel"]) == {}
        with pytest.raises(aioredis.ConnectionError):  # a write fails its step: it retries
            await ThemeWeights(dead, "x:").put("ada", {"travel": TunedParams()})
    finally:
        await dead.aclose()


async def test_a_user_keeps_the_most_recently_stored_themes_only(weights: ThemeWeights) -> None:
    """A model that names a new theme every round: the hash stays at the workflow's bound
    (MAX_TUNED_THEMES), keeping the newest, as the user workflow's own cache does."""
    from mnemoflow.models.round_store import MAX_TUNED_THEMES

    themes = [f"errand {i}: {chr(0x4E00 + i)}" for i in range(MAX_TUNED_THEMES + 16)]
    dropped = 0
    for i, theme in enumerate(themes):
        dropped += await weights.put("ada", {theme: TunedParams(w0=i / 100)})
        if i == len(themes) - 10:  # the first theme is tuned again: it is recent now
            dropped += await weights.put("ada", {themes[0]: TunedParams(w0=0.5)})
    key = weights_key(weights.prefix, "ada")
    assert await weights._redis.hlen(key) == MAX_TUNED_THEMES
    assert dropped == 17  # 80 themes, the first stored twice (dropped, then back)
    got = await weights.get("ada", themes)
    assert set(got) == {themes[0], *themes[-(MAX_TUNED_THEMES - 1) :]}
    assert got[themes[0]].w0 == pytest.approx(0.5, abs=1e-3)
    # Another user's hash is its own; one put of many themes keeps the bound too.
    await weights.put("bob", {t: TunedParams() for t in themes[:3]})
    assert await weights._redis.hlen(weights_key(weights.prefix, "bob")) == 3
    assert await weights.put("ada", {t: TunedParams() for t in themes[:8]}, keep=4) > 0
    assert await weights._redis.hlen(key) == 4
