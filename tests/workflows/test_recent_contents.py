"""The contents the user workflow keeps of its latest rounds' fragments (state `recent`), so a
round need not send back what it made before (docs/ARCHITECTURE.md, "The round"): which
rounds are vouched for, the bounds, and what ends the vouching. Pure state, no server."""

from __future__ import annotations

import pytest

from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    ContextFragment,
    FragmentRef,
    InjectedContext,
    RoundRecord,
    RoundResult,
    UserMemoryState,
    stub_fragment,
)
from mnemoflow.models.ids import explicit_fragment_id, fragment_id
from mnemoflow.models.round_store import held_by_round, round_of
from mnemoflow.workflows import state_ops

USER = "ada:lovelace/ünïcode"
CFG = MemoryConfig.from_vocation("customer service")


def piece(round_no: int, index: int, content: str | None = None) -> ContextFragment:
    return ContextFragment(
        id=fragment_id(USER, round_no, index),
        theme="errands",
        types=["fact"],
        content=content or f"round {round_no} said thing {index}",
        score=0.7,
        created_at=1000.0 + round_no,
    )


def result(
    round_no: int, published: list[ContextFragment], unpublished: list[ContextFragment]
) -> RoundResult:
    """A round that stored `published` and `unpublished` (its own) and published `published`."""
    own = [*published, *unpublished]
    return RoundResult(
        round_no=round_no,
        fragments=[FragmentRef(id=f.id, created_at=f.created_at, seq=i) for i, f in enumerate(own)],
        context=InjectedContext(user_id=USER, version=round_no, fragments=published),
        by_reference=True,
        made=unpublished,
    )


def kept(s: UserMemoryState) -> list[str]:
    return [f.id for f in s.recent]


def test_round_numbers_are_read_from_the_users_own_ids_only() -> None:
    assert round_of(USER, fragment_id(USER, 17, 3)) == 17
    assert round_of(USER, explicit_fragment_id(USER, "event-1")) is None
    assert round_of(USER, fragment_id("someone else", 17, 3)) is None
    assert round_of(USER, fragment_id(USER, 17, 3) + "x") is None
    assert held_by_round(USER, fragment_id(USER, 17, 0), 17)
    assert held_by_round(USER, fragment_id(USER, 18, 0), 17)
    assert not held_by_round(USER, fragment_id(USER, 16, 0), 17)
    assert not held_by_round(USER, fragment_id(USER, 17, 0), 0)  # 0: nothing vouched for
    assert not held_by_round(USER, explicit_fragment_id(USER, "event-1"), 1)


def test_every_stored_fragment_of_a_round_is_kept_whole_from_its_first_round() -> None:
    s = UserMemoryState()
    state_ops.keep_made(s, USER, 3, result(3, [piece(3, 0)], [piece(3, 1)]), set())
    assert s.recent_from == 3 and kept(s) == [piece(3, 0).id, piece(3, 1).id]
    # A published content that is not the round's own, and a stub, are not kept.
    earlier = piece(1, 0)
    r = result(4, [piece(4, 0)], [])
    r.context.fragments = [earlier, piece(4, 0), stub_fragment(piece(2, 0).id)]
    state_ops.keep_made(s, USER, 4, r, set())
    assert s.recent_from == 3 and kept(s) == [piece(3, 0).id, piece(3, 1).id, piece(4, 0).id]
    assert all(f.content and f.score == 0.0 for f in s.recent)


def test_forgotten_fragments_are_not_kept_and_leave_when_forgotten() -> None:
    s = UserMemoryState()
    gone = piece(5, 1)
    state_ops.keep_made(s, USER, 5, result(5, [piece(5, 0)], [gone]), {gone.id})
    assert kept(s) == [piece(5, 0).id]
    state_ops.forget_fragment_facts(s, piece(5, 0).id)
    assert kept(s) == [] and s.recent_from == 5  # still vouched: forgotten ones are gone


def test_a_round_from_before_the_field_a_failure_a_collision_or_a_forget_vouch_for_nothing() -> (
    None
):
    s = UserMemoryState()
    state_ops.keep_made(s, USER, 1, result(1, [piece(1, 0)], []), set())
    old = result(2, [piece(2, 0)], [])
    old.made = None  # recorded before `made`: it cannot say what it stored
    state_ops.keep_made(s, USER, 2, old, set())
    assert s.recent_from == 0 and s.recent == []
    # The next round starts the vouching again from itself.
    state_ops.keep_made(s, USER, 3, result(3, [piece(3, 0)], []), set())
    assert s.recent_from == 3
    record = RoundRecord(
        round_no=4,
        workflow_id="w",
        event_id="t:0-2",
        thread_id="t",
        start=0,
        end=2,
        trigger="handover",
    )
    state_ops.thread_state(s, "t")
    state_ops.round_failed(s, record, "boom", 0.0, CFG)
    assert s.recent_from == 0 and s.recent == []
    state_ops.keep_made(s, USER, 5, result(5, [piece(5, 0)], []), set())
    state_ops.forget_all(s)
    assert s.recent_from == 0 and s.recent == []
    state_ops.keep_made(s, USER, 6, result(6, [piece(6, 0)], []), set())
    state_ops.drop_recent(s)
    assert s.recent_from == 0 and s.recent == []


@pytest.mark.parametrize("by", ["count", "bytes"])
def test_the_oldest_rounds_go_first_and_are_no_longer_vouched_for(
    by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if by == "count":
        monkeypatch.setattr(state_ops, "RECENT_MAX_FRAGMENTS", 5)
    else:
        monkeypatch.setattr(state_ops, "RECENT_MAX_BYTES", 5 * 100)
    s = UserMemoryState()
    for n in range(1, 5):  # two fragments of 100 characters per round
        made = [piece(n, 0, f"{n}" * 100), piece(n, 1, f"{n + 5}" * 100)]
        state_ops.keep_made(s, USER, n, result(n, made[:1], made[1:]), set())
    # Rounds go whole: 4 fragments kept (rounds 3 and 4), rounds from 3 on vouched for.
    assert s.recent_from == 3
    assert kept(s) == [piece(3, 0).id, piece(3, 1).id, piece(4, 0).id, piece(4, 1).id]
    for f in s.recent:
        assert held_by_round(USER, f.id, s.recent_from)
    # A round alone past the bounds vouches for the rounds after it only.
    big = [piece(5, i, "x" * 100) for i in range(6)]
    state_ops.keep_made(s, USER, 5, result(5, big[:3], big[3:]), set())
    assert s.recent == [] and s.recent_from == 6
    state_ops.keep_made(s, USER, 6, result(6, [piece(6, 0)], []), set())
    assert s.recent_from == 6 and kept(s) == [piece(6, 0).id]


def test_window_off_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_ops, "RECENT_MAX_FRAGMENTS", 0)
    s = UserMemoryState()
    state_ops.keep_made(s, USER, 1, result(1, [piece(1, 0)], []), set())
    assert s.recent == [] and s.recent_from == 2


def test_the_byte_bound_counts_utf8_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(state_ops, "RECENT_MAX_BYTES", 300)
    s = UserMemoryState()
    made = [piece(1, 0, "猫" * 60)]  # 60 characters, 180 bytes
    state_ops.keep_made(s, USER, 1, result(1, made, []), set())
    assert kept(s) == [made[0].id]
    state_ops.keep_made(s, USER, 2, result(2, [piece(2, 0, "犬" * 60)], []), set())
    assert kept(s) == [piece(2, 0).id] and s.recent_from == 2  # 360 bytes: round 1 went


def test_a_kept_fragment_is_named_by_the_state() -> None:
    """A forget whose reply was lost cleans up only what the state names (state_ops.mentions):
    a fragment kept only in `recent` counts."""
    s = UserMemoryState()
    only_kept = piece(1, 1)
    state_ops.keep_made(s, USER, 1, result(1, [piece(1, 0)], [only_kept]), set())
    assert state_ops.mentions(s, only_kept.id)
    state_ops.forget_fragment_facts(s, only_kept.id)
    assert not state_ops.mentions(s, only_kept.id) and only_kept.id not in kept(s)
