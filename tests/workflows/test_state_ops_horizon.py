"""A horizon never passes the workflow's clock (patch `horizon-at-now`): a thread pruned, or
whose identities were forgotten, while its newest stamp was ahead of the clock kept that future
stamp as its horizon and refused every later line."""

from __future__ import annotations

from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    InjectedContext,
    RoundRecord,
    RoundResult,
    SubmitEvent,
    UserMemoryState,
)
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import PriceTable
from mnemoflow.workflows import state_ops

CFG = MemoryConfig.from_vocation("customer service")
NOW = 1_796_000_000.0
HOUR = 3600.0


def line(thread: str, n: int, t: float) -> ChatTurn:
    return ChatTurn(
        thread_id=thread, position=n, role="human", content=f"{thread} line {n}", time=t
    )


def submit(s: UserMemoryState, event: str, turns: list[ChatTurn], now: float, at_now: bool) -> None:
    state_ops.absorb_submit(s, SubmitEvent(event_id=event, turns=turns), CFG, now, at_now)


def index(s: UserMemoryState, thread: str, now: float) -> None:
    record = RoundRecord(
        round_no=1, workflow_id="w", event_id="x", thread_id=thread, start=0, end=1,
        trigger="handover",
    )  # fmt: skip
    result = RoundResult(round_no=1, fragments=[], context=InjectedContext(user_id="u", version=1))
    batch = list(s.threads[thread].pending)
    state_ops.round_completed(s, record, result, batch, now, PriceTable())


def pending(s: UserMemoryState, thread: str) -> list[ChatTurn]:
    ts = s.threads.get(thread)
    return [] if ts is None else list(ts.pending)


def prune_victim(at_now: bool) -> tuple[UserMemoryState, float]:
    """Thread "v" said one line stamped an hour ahead; then MAX_IDLE_THREADS other threads."""
    s = UserMemoryState()
    submit(s, "v1", [line("v", 0, NOW + HOUR)], NOW, at_now)
    index(s, "v", NOW)
    now = NOW
    for i in range(state_ops.MAX_IDLE_THREADS):
        now = NOW + 10 + i
        submit(s, f"o{i}", [line(f"o{i}", 0, now - 5)], now, at_now)
        index(s, f"o{i}", now)
    assert "v" not in s.threads
    return s, now


def test_a_thread_pruned_while_stamped_ahead_takes_what_is_said_next() -> None:
    s, now = prune_victim(at_now=True)
    assert max(s.retired_threads.values()) == now  # retired at the clock, not an hour ahead
    later = now + 60
    submit(s, "v2", [line("v", 1, later - 2)], later, True)  # said just before delivery
    assert [t.content for t in s.threads["v"].pending] == ["v line 1"]


def test_without_the_patch_the_old_rule_replays() -> None:
    """Histories recorded before the patch keep the future horizon (and its refusals)."""
    s, now = prune_victim(at_now=False)
    assert max(s.retired_threads.values()) == NOW + HOUR
    submit(s, "v2", [line("v", 1, now + 58)], now + 60, False)
    assert pending(s, "v") == []  # refused (and the thread, idle again, pruned again)


def test_a_pruned_thread_still_refuses_its_old_lines_with_the_patch() -> None:
    s = UserMemoryState()
    submit(s, "a", [line("a", 0, NOW - 50), line("a", 1, NOW - 40)], NOW, True)
    index(s, "a", NOW)
    for i in range(state_ops.MAX_IDLE_THREADS):
        submit(s, f"o{i}", [line(f"o{i}", 0, NOW + i)], NOW + 10 + i, True)
        index(s, f"o{i}", NOW + 10 + i)
    assert "a" not in s.threads
    submit(s, "again", [line("a", 0, NOW - 50), line("a", 1, NOW - 40)], NOW + 500, True)
    assert pending(s, "a") == []  # the horizon (the newest stamp, -40) still holds


def test_forgotten_identities_never_move_a_horizon_past_the_clock() -> None:
    """The bounded `seen` set forgets a thread's oldest identities; one stamped ahead of the
    clock moved the live thread's horizon into the future, refusing every later line."""
    s = UserMemoryState()
    submit(s, "ahead", [line("a", 0, NOW + HOUR)], NOW, True)
    index(s, "a", NOW)
    for k in range(0, state_ops.MAX_SEEN_MESSAGES + 10, 100):
        batch = [line("a", p, NOW - 10_000 + p) for p in range(k + 1, k + 101)]
        submit(s, f"e{k}", batch, NOW, True)
        index(s, "a", NOW)
    ts = s.threads["a"]
    assert len(ts.seen) <= state_ops.MAX_SEEN_MESSAGES
    assert ts.horizon <= NOW
    # the identity stamped ahead is forgotten last: a re-send of it is still refused
    submit(s, "ahead-again", [line("a", 0, NOW + HOUR)], NOW + 5, True)
    assert ts.pending == []
    submit(s, "next", [line("a", 99_999, NOW + 3)], NOW + 5, True)
    assert [t.position for t in ts.pending] == [99_999]


def test_without_the_patch_a_forgotten_future_stamp_sets_a_future_horizon() -> None:
    s = UserMemoryState()
    submit(s, "ahead", [line("a", 0, NOW + HOUR)], NOW, False)
    index(s, "a", NOW)
    for k in range(0, state_ops.MAX_SEEN_MESSAGES + 10, 100):
        batch = [line("a", p, NOW - 10_000 + p) for p in range(k + 1, k + 101)]
        submit(s, f"e{k}", batch, NOW, False)
        index(s, "a", NOW)
    assert s.threads["a"].horizon == NOW + HOUR


def test_the_patch_is_asked_only_when_something_is_stamped_ahead() -> None:
    s = UserMemoryState()
    past = SubmitEvent(event_id="p", turns=[line("a", 0, NOW - 1)])
    assert not state_ops.stamped_ahead(s, [past], NOW)
    state_ops.absorb_submit(s, past, CFG, NOW)
    assert not state_ops.stamped_ahead(s, [], NOW)
    ahead = SubmitEvent(event_id="f", turns=[line("a", 1, NOW + 1)])
    assert state_ops.stamped_ahead(s, [ahead], NOW)
    state_ops.absorb_submit(s, ahead, CFG, NOW)
    assert state_ops.stamped_ahead(s, [], NOW)  # remembered in `seen`
    assert not state_ops.stamped_ahead(s, [], NOW + 2)


def test_a_horizon_set_ahead_before_the_rule_comes_back_to_now() -> None:
    """Stamps in milliseconds were read as seconds before they were scaled (Date.now() ~1.7e12):
    a thread pruned or bounded then kept a horizon 50,000 years ahead, and after the upgrade
    every line said on it, now read in seconds, was refused (probe: 0 of 10 stored)."""
    ms_era = (NOW - HOUR) * 1000  # the last line forgotten an hour ago, stamped in ms
    for at_now, kept in ((False, 0), (True, 2)):
        s = UserMemoryState()
        s.threads["live"] = state_ops.ThreadState(horizon=ms_era)
        s.retired_threads[state_ops.identity_digest("old")] = ms_era
        assert state_ops.stamped_ahead(s, [], NOW)
        said_now = [line("live", 7, NOW - 5), line("old", 3, NOW - 4)]
        resent = [line("live", 1, NOW - 2 * HOUR), line("old", 1, NOW - 3 * HOUR)]
        submit(s, "e", said_now + resent, NOW, at_now)
        assert sorted(t.content for t in pending(s, "live") + pending(s, "old")) == sorted(
            t.content for t in said_now[:kept]
        )
        if at_now:  # in seconds, as the re-sent lines are now read: still refused
            assert s.threads["live"].horizon == s.threads["old"].horizon == NOW - HOUR
