"""forget_fragment on the dev server with the real worker, Milvus Lite and Redis: the fragment
leaves Milvus, the read model at once (no waiting for a later round), and the profile facts that
were inducted from it alone."""

from __future__ import annotations

import time

import pytest

from mnemoflow.models.turns import ChatTurn
from tests.middleware.conftest import LiveMemory
from tests.support.invariants import said_vs_stored
from tests.support.reliability import Ledger

pytestmark = pytest.mark.integration


async def test_forget_fragment_republishes_and_removes_its_profile_facts(
    live_memory: LiveMemory, reliability: Ledger, request: pytest.FixtureRequest
) -> None:
    started = time.monotonic()
    client, user = live_memory.client, live_memory.new_user("forget-one")
    t0 = time.time() - 3 * 3600  # old enough to be sliced and inducted right away
    lines = [
        ("human", "My name is Zora Quill."),
        ("ai", "Hello Zora."),
    ]
    turns = [
        ChatTurn(thread_id="t", position=i, role=role, content=text, time=t0 + 30 * i,
                 message_id=f"zq-{i}")
        for i, (role, text) in enumerate(lines)
    ]  # fmt: skip
    await client.submit(user, turns, urgent=True)
    settled = await client.settle(user, 90, inducted=True)
    assert settled is not None
    profile = await client.profile(user)
    assert profile is not None and profile.name == "Zora Quill"
    stored = await live_memory.worker.store.all_for_user(user)
    source = next(f for f in stored if "Zora Quill" in f.content)
    before = await client.context(user)
    assert before is not None and source.id in {f.id for f in before.fragments}

    result = await client.forget_fragment(user, source.id)
    assert result.deleted == 1 and result.republished and result.profile_facts_removed >= 1
    after = await client.context(user)  # the read model (Redis), right after the update
    assert after is not None and after.version > before.version
    assert source.id not in {f.id for f in after.fragments}
    assert after.profile.name is None
    assert (await client.profile(user)).name is None  # type: ignore[union-attr]
    assert source.id not in {f.id for f in await live_memory.worker.store.all_for_user(user)}
    again = await client.forget_fragment(user, source.id)
    assert again.deleted == 0 and not again.republished
    # Counted: the lines the forgotten fragment held are in no row, the others in one each.
    texts = [text for _, text in lines]
    gone = [text for text in texts if text in source.content]
    outcome = await said_vs_stored(
        live_memory.worker.store, user, None, {"t": [t for t in texts if t not in gone]},
        forgotten=gone,
    )  # fmt: skip
    assert gone and outcome.clean, outcome
    reliability.record(
        request,
        key="forget-fragment",
        kind="fault",
        what="forget_fragment of a fragment that was published and whose fact (a name) was "
        "inducted into the profile",
        happened="the read model was republished at once without the fragment, and the profile "
        f"fact inducted from it alone was removed ({result.profile_facts_removed}); the Milvus "
        "row is gone",
        outcome=outcome,
        started=started,
    )
