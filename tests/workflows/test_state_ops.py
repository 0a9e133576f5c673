"""The user workflow's state transitions, without a server: de-duplication, deadlines, cursor."""

from __future__ import annotations

import pytest

from mnemoflow.memory.formulas import time_to_maturity
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    ContextFragment,
    FragmentRef,
    InductOutput,
    InjectedContext,
    ReinforceEvent,
    RoundRecord,
    RoundResult,
    SubmitEvent,
    UserMemoryState,
    Watermark,
)
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn, identity_digest, turn_identity
from mnemoflow.models.usage import LLMUsage, PriceTable
from mnemoflow.workflows import state_ops

CFG = MemoryConfig.from_vocation("customer service")
T0 = 1_700_000_000.0


def turns(thread: str, start: int, end: int, t: float = T0) -> list[ChatTurn]:
    return [
        ChatTurn(
            thread_id=thread,
            position=p,
            role="human" if p % 2 == 0 else "ai",
            content=f"message {p}",
            time=t + p,
        )
        for p in range(start, end)
    ]


def submit(s: UserMemoryState, event_id: str, batch: list[ChatTurn], **kw: object) -> None:
    state_ops.absorb_submit(s, SubmitEvent(event_id=event_id, turns=batch, **kw), CFG, T0)


def test_duplicate_events_and_resent_messages_change_nothing() -> None:
    s = UserMemoryState()
    submit(s, "e1", turns("a", 0, 4))
    snapshot = s.model_copy(deep=True)
    submit(s, "e1", turns("a", 0, 4))
    assert s == snapshot
    submit(s, "e2", turns("a", 0, 6))  # a re-send overlapping the accepted range
    assert [t.position for t in s.threads["a"].pending] == [0, 1, 2, 3, 4, 5]
    assert s.threads["a"].accepted == 6


def test_long_turns_are_trimmed_on_entry() -> None:
    s = UserMemoryState()
    big = ChatTurn(thread_id="a", position=0, role="tool", content="x" * 50_000, time=T0)
    submit(s, "e1", [big])
    assert len(s.threads["a"].pending[0].content) == CFG.max_turn_chars


def test_round_is_due_at_the_slice_gate_or_at_once_when_urgent() -> None:
    s = UserMemoryState()
    submit(s, "e1", turns("a", 0, 2))
    gate = T0 + time_to_maturity(CFG.slice_gate, CFG.tau_m, CFG.c_m)
    assert state_ops.due_thread(s, CFG, T0 + 14 * 60) is None
    assert state_ops.due_thread(s, CFG, T0 + 15 * 60) == "a"
    assert state_ops.next_due(s, CFG) == pytest.approx(gate)
    submit(s, "e2", turns("b", 0, 2, t=T0 + 100), urgent=True)
    assert state_ops.due_thread(s, CFG, T0 + 101) == "b"


def _result(refs: list[FragmentRef]) -> RoundResult:
    return RoundResult(
        round_no=1,
        fragments=refs,
        context=InjectedContext(user_id="u", version=1),
        usage={"slice": LLMUsage(calls=1, input_tokens=100, output_tokens=10)},
    )


def test_completed_round_advances_indexed_and_failed_round_backs_off() -> None:
    s = UserMemoryState()
    batch = turns("a", 0, 4)
    submit(s, "e1", batch)
    record = RoundRecord(
        round_no=1,
        workflow_id="w/round-1",
        event_id="x",
        thread_id="a",
        start=0,
        end=4,
        trigger="handover",
    )
    state_ops.round_failed(s, record, "boom", T0 + 900, CFG)
    assert s.threads["a"].pending and s.threads["a"].indexed == 0
    assert state_ops.due_thread(s, CFG, T0 + 901) is None
    assert state_ops.due_thread(s, CFG, T0 + 900 + CFG.failed_round_backoff_s) == "a"
    refs = [FragmentRef(id="f1", created_at=T0, seq=1), FragmentRef(id="f2", created_at=T0, seq=2)]
    state_ops.round_completed(s, record, _result(refs), batch, T0 + 2000, PriceTable())
    assert s.threads["a"].indexed == 4 and not s.threads["a"].pending
    assert s.fragment_seq == 2 and len(s.uninducted) == 2
    assert s.ledger.by_operation["slice"].calls == 1 and s.ledger.cost > 0


def _record(round_no: int, thread: str = "a") -> RoundRecord:
    return RoundRecord(
        round_no=round_no,
        workflow_id=f"w/round-{round_no}",
        event_id="x",
        thread_id=thread,
        start=0,
        end=4,
        trigger="handover",
    )


def test_failed_rounds_are_swept_by_their_threads_next_round_only() -> None:
    s = UserMemoryState()
    submit(s, "e1", turns("a", 0, 4))
    submit(s, "e2", turns("b", 0, 2))
    state_ops.round_failed(s, _record(3), "boom", T0, CFG)
    state_ops.round_failed(s, _record(3), "boom again", T0, CFG)  # counted once
    state_ops.round_failed(s, _record(4), "never started", T0, CFG, started=False)
    state_ops.round_failed(s, _record(5, "b"), "boom", T0, CFG)
    assert s.threads["a"].failed_rounds == [3] and s.threads["b"].failed_rounds == [5]
    # A result that swept nothing (a store step from before sweeping) keeps them for later.
    state_ops.round_completed(s, _record(6), _result([]), turns("a", 0, 4), T0, PriceTable())
    assert s.threads["a"].failed_rounds == [3]
    swept = _result([]).model_copy(update={"swept_rounds": [3]})
    submit(s, "e3", turns("a", 4, 6))
    state_ops.round_completed(s, _record(7), swept, turns("a", 4, 6), T0, PriceTable())
    assert s.threads["a"].failed_rounds == [] and s.threads["b"].failed_rounds == [5]
    for n in range(100, 100 + state_ops.MAX_FAILED_ROUNDS + 5):
        state_ops.round_failed(s, _record(n, "b"), "boom", T0, CFG)
    kept, bound = s.threads["b"].failed_rounds, state_ops.MAX_FAILED_ROUNDS
    assert len(kept) == bound and kept[-1] == 104 + bound
    state_ops.forget_all(s)
    assert s.threads["b"].failed_rounds == []


def _row(start: int, end: int, lines: list[str]) -> Fragment:
    content = "\n".join(lines)
    return Fragment(
        id="u-r3-f0", user_id="u", theme="t", types=["chat"], content=content, created_at=T0,
        reinforced_at=T0, round_no=3, thread_id="a", start_pos=start, end_pos=end,
    )  # fmt: skip


def _said(ts: object, positions: list[int]) -> list[str]:
    pending = ts.pending  # type: ignore[attr-defined]
    return [next(t.content for t in pending if t.position == p) for p in positions]


def test_a_forgotten_row_of_a_failed_round_takes_out_what_it_quoted_by_identity() -> None:
    """Only turns the failed round took, at positions in the row's span, by the same speaker;
    never by place in the pending list (turns delivered late, said earlier, sort first)."""
    s = UserMemoryState()
    submit(s, "e1", turns("a", 10, 16))
    late = turns("a", 12, 13, t=T0 - 100)[0].model_copy(
        update={"position": 12, "content": "message 1", "time": T0 - 100}
    )
    state_ops.round_failed(s, _record(3), "boom", T0, CFG, batch=s.threads["a"].pending[:4])
    submit(s, "e2", [late])  # said earlier, at a position inside the span, after the round
    assert (
        state_ops.failed_round_thread(s, 3) == "a" and state_ops.failed_round_thread(s, 9) is None
    )
    ts = s.threads["a"]
    row = _row(
        10,
        14,
        [
            "User: message 10",
            "Assistant: message 11",
            "User: message 1",  # the late turn's words: it was not in the round
            "User: message 13",  # said by the assistant: another speaker's line
        ],
    )
    parts = state_ops.forgotten_parts(ts, 3, row)
    assert [(t.position, left) for t, left in parts] == [(10, None), (11, None)]
    assert state_ops.forget_turns(s, "a", parts) == 2
    assert sorted(t.position for t in ts.pending) == [12, 12, 13, 14, 15]
    assert (ts.accepted, ts.indexed) == (5, 0)  # accepted == indexed + pending
    # They stay accepted identities: a re-send of the forgotten turns is a no-op.
    submit(s, "e3", turns("a", 10, 12))
    assert len(ts.pending) == 5 and ts.accepted == 5
    # A paraphrased row (its text not the turns') takes nothing out.
    assert state_ops.forgotten_parts(ts, 3, _row(13, 16, ["User: they talked"])) == []


def test_a_forgotten_piece_of_a_long_turn_leaves_the_rest_of_it_pending() -> None:
    s = UserMemoryState()
    long = "First part of it. Second part, longer. Third and last part."
    said = turns("a", 0, 2)
    said[0] = said[0].model_copy(update={"content": long})
    submit(s, "e1", said)
    state_ops.round_failed(s, _record(3), "boom", T0, CFG, batch=list(said))
    ts = s.threads["a"]
    row = _row(0, 1, ["User: First part of it.", "User: Third and last part."])
    parts = state_ops.forgotten_parts(ts, 3, row)
    assert [(t.position, left) for t, left in parts] == [(0, "Second part, longer.")]
    state_ops.forget_turns(s, "a", parts)
    assert _said(ts, [0, 1]) == ["Second part, longer.", "message 1"]
    assert ts.accepted == 2
    # Chinese pieces meet at "。" with no space between them; a piece inside a longer word
    # is not one.
    cjk = ChatTurn(
        thread_id="a", position=5, role="human", time=T0 + 5,
        content="我周三要去仓库。订单4471明天到。请把发票寄到公司。",
    )  # fmt: skip
    s.threads["a"].failed_batches["3"].append(identity_digest(turn_identity(cjk)))
    ts.pending.append(cjk)
    piece = _row(5, 6, ["User: 订单4471明天到。", "User: 仓库"])
    assert [left for _, left in state_ops.forgotten_parts(ts, 3, piece)] == [
        "我周三要去仓库。请把发票寄到公司。"
    ]
    ts.pending.remove(cjk)
    # The slicer joins a piece's sentences with its own spacing; and a reply that quotes a
    # "User: ..." line is quoted whole over two of the row's lines.
    spaced = cjk.model_copy(
        update={"content": "First line here.\n\nSecond line  here.\nThird.", "position": 6}
    )
    quoting = cjk.model_copy(
        update={"content": "You sent:\nUser: ship 7777\nDone.", "position": 7, "role": "ai"}
    )
    for extra in (spaced, quoting):
        s.threads["a"].failed_batches["3"].append(identity_digest(turn_identity(extra)))
        ts.pending.append(extra)
    rows = _row(6, 8, ["User: First line here. Second line here.", "Assistant: You sent:",
                       "User: ship 7777\nDone."])  # fmt: skip
    parts = state_ops.forgotten_parts(ts, 3, rows)
    assert [(t.position, left) for t, left in parts] == [(6, "Third."), (7, None)]
    ts.pending.remove(spaced)
    ts.pending.remove(quoting)
    # A round that completes with the trimmed turn leaves nothing pending.
    state_ops.round_completed(s, _record(4), _result([]), list(ts.pending), T0, PriceTable())
    assert ts.pending == [] and (ts.accepted, ts.indexed) == (2, 2)
    assert ts.failed_batches == {"3": ts.failed_batches["3"]}  # kept until the round is swept
    swept = _result([]).model_copy(update={"swept_rounds": [3]})
    state_ops.round_completed(s, _record(5), swept, [], T0, PriceTable())
    assert ts.failed_batches == {} and ts.failed_rounds == []


def test_a_held_thread_has_no_round_due_until_it_is_let_go() -> None:
    s = UserMemoryState()
    submit(s, "e1", turns("a", 0, 4), urgent=True)
    now = T0 + 10
    assert state_ops.due_thread(s, CFG, now) == "a"
    assert state_ops.due_thread(s, CFG, now, {"a"}) is None
    assert state_ops.next_due(s, CFG, {"a"}) is None
    assert state_ops.next_due(s, CFG) is not None


def test_induction_cursor_moves_only_forward_and_only_when_stored() -> None:
    s = UserMemoryState(
        uninducted=[
            FragmentRef(id="f1", created_at=T0, seq=1),
            FragmentRef(id="f2", created_at=T0 + 5000, seq=2),
        ]
    )
    gate = time_to_maturity(CFG.long_term_gate, CFG.tau_m, CFG.c_m)
    assert state_ops.mature_for_induction(s, CFG, T0 + gate - 1) == []
    ready = state_ops.mature_for_induction(s, CFG, T0 + gate + 1)
    assert [r.id for r in ready] == ["f1"]
    assert s.induction_cursor == 0  # asking is not storing
    out = InductOutput(profile=UserProfile(name="Ada"), inducted=["f1"])
    state_ops.induction_stored(s, ready, out, PriceTable())
    assert s.induction_cursor == 1 and s.profile.name == "Ada"
    state_ops.induction_stored(s, [FragmentRef(id="old", created_at=T0, seq=0)], out, PriceTable())
    assert s.induction_cursor == 1


def test_reinforcement_once_per_call_id() -> None:
    s = UserMemoryState()
    state_ops.absorb_reinforce(s, ReinforceEvent(call_id="c1", fragment_ids=["f1"]))
    state_ops.absorb_reinforce(s, ReinforceEvent(call_id="c1", fragment_ids=["f1"]))
    assert len(s.pending_reinforce) == 1


def test_seen_sets_stay_bounded() -> None:
    s = UserMemoryState()
    for i in range(state_ops.MAX_SEEN_EVENTS + 10):
        submit(s, f"e{i}", [])
    assert len(s.seen_event_ids) == state_ops.MAX_SEEN_EVENTS
    assert s.seen_event_ids[-1] == f"e{state_ops.MAX_SEEN_EVENTS + 9}"


def _complete(s: UserMemoryState, batch: list[ChatTurn]) -> None:
    record = RoundRecord(
        round_no=1, workflow_id="w", event_id="x", thread_id="a", start=0, end=1, trigger="handover"
    )
    state_ops.round_completed(s, record, _result([]), batch, T0, PriceTable())


def test_out_of_order_and_resent_messages_are_each_indexed_once() -> None:
    s = UserMemoryState()
    late = turns("a", 0, 6)
    submit(s, "e1", [late[0], late[1], late[3], late[5]])  # 2 and 4 are still on their way
    ts = s.threads["a"]
    _complete(s, state_ops.round_batch(ts, 64))  # 0, 1, 3, 5: no hole can hold a round back
    assert ts.indexed == 4 and ts.accepted == 4 and not ts.pending
    submit(s, "e2", [late[2], late[3], late[4]])  # 3 again is recognised by its identity
    assert sorted(t.position for t in ts.pending) == [2, 4]
    assert state_ops.watermark(ts).pending_since == late[2].time
    _complete(s, state_ops.round_batch(ts, 64))
    assert ts.indexed == ts.accepted == 6 and state_ops.watermark(ts).pending_since is None


def test_identity_is_the_message_not_its_position() -> None:
    # Two writers with their own lists: the same position holds different messages, and a
    # rewritten list (summarisation) moves a message to another position.
    s = UserMemoryState()
    a = [
        ChatTurn(
            thread_id="a",
            position=i,
            role="human",
            content=f"A{i}",
            time=T0 + i,
            message_id=f"a-{i}",
        )
        for i in range(3)
    ]
    b = [
        ChatTurn(
            thread_id="a",
            position=i,
            role="human",
            content=f"B{i}",
            time=T0 + 10 + i,
            message_id=f"b-{i}",
        )
        for i in range(3)
    ]
    submit(s, "ea", a)
    submit(s, "eb", b)
    moved = a[2].model_copy(update={"position": 0})  # after a rewrite of writer a's list
    submit(s, "ea2", [moved])
    ts = s.threads["a"]
    assert ts.accepted == 6
    assert sorted(t.content for t in ts.pending) == ["A0", "A1", "A2", "B0", "B1", "B2"]
    # Without an id, the hash of role, content and time is the identity.
    plain = ChatTurn(thread_id="a", position=9, role="ai", content="same", time=T0 + 50)
    submit(s, "p1", [plain])
    submit(s, "p2", [plain.model_copy(update={"position": 3})])
    submit(s, "p3", [plain.model_copy(update={"time": T0 + 51})])  # said again, later
    assert ts.accepted == 8


def test_forget_fence_refuses_messages_said_before_it() -> None:
    s = UserMemoryState()
    submit(s, "e1", turns("a", 0, 2))
    state_ops.forget_all(s)
    s.fence = T0 + 100
    submit(s, "late", turns("a", 2, 4))  # said before the forget, delivered after it
    assert not s.threads["a"].pending
    submit(s, "new", turns("a", 4, 6, T0 + 200))
    assert [t.position for t in s.threads["a"].pending] == [4, 5]


def test_the_forget_epoch_decides_whatever_the_time_stamps_say() -> None:
    """docs/ARCHITECTURE.md, "Forget epochs": a message stamped with an epoch is judged by it
    alone, one without by the time fence."""
    s = UserMemoryState(forget_epoch=1, fence=T0 + 100)

    def stamped(start: int, end: int, t: float, epoch: int | None) -> list[ChatTurn]:
        return [x.model_copy(update={"epoch": epoch}) for x in turns("a", start, end, t)]

    def absorb(event_id: str, batch: list[ChatTurn]) -> None:
        event = SubmitEvent(event_id=event_id, turns=batch)
        state_ops.absorb_submit(s, event, CFG, T0 + 300, epoch_rule=True)

    absorb("before-ahead", stamped(0, 2, T0 + 110, 0))  # said before, clock 10 s+ ahead
    absorb("after-behind", stamped(2, 4, T0 + 90, 1))  # said after, clock 10 s+ behind
    absorb("unstamped-old", stamped(4, 6, T0 + 50, None))  # no epoch: the time fence
    absorb("unstamped-new", stamped(6, 8, T0 + 150, None))
    assert [t.position for t in s.threads["a"].pending] == [2, 3, 6, 7]
    assert s.refused_stale == 2
    # Histories from before the patch judge every message by its time.
    old = UserMemoryState(forget_epoch=1, fence=T0 + 100)
    event = SubmitEvent(event_id="x", turns=stamped(0, 2, T0 + 90, 1))
    state_ops.absorb_submit(old, event, CFG, T0 + 300)
    assert not old.threads


def test_seen_identities_stay_bounded_and_old_resends_stay_refused() -> None:
    s = UserMemoryState()
    total = state_ops.MAX_SEEN_MESSAGES + 100
    for start in range(0, total, 50):
        batch = turns("a", start, min(start + 50, total))
        submit(s, f"e{start}", batch)
        _complete(s, batch)
    ts = s.threads["a"]
    assert len(ts.seen) <= state_ops.MAX_SEEN_MESSAGES and ts.horizon > T0
    submit(s, "again", turns("a", 0, total))  # the whole thread re-sent
    assert not ts.pending and ts.accepted == total


def test_a_pruned_idle_thread_keeps_refusing_its_old_messages() -> None:
    s = UserMemoryState()
    submit(s, "old", turns("old", 0, 2))
    _complete_thread(s, "old")
    for i in range(state_ops.MAX_IDLE_THREADS + 1):
        submit(s, f"e{i}", turns(f"t{i}", 0, 1, T0 + 1000 + i))
        _complete_thread(s, f"t{i}")
    assert "old" not in s.threads
    submit(s, "old-again", turns("old", 0, 2))
    assert sum(len(t.pending) for t in s.threads.values()) == 0
    submit(s, "old-new", turns("old", 2, 3, T0 + 5000))  # said later: accepted
    assert [t.position for t in s.threads["old"].pending] == [2]


def _complete_thread(s: UserMemoryState, thread: str) -> None:
    ts = s.threads[thread]
    record = RoundRecord(
        round_no=1,
        workflow_id="w",
        event_id="x",
        thread_id=thread,
        start=0,
        end=1,
        trigger="handover",
    )
    state_ops.round_completed(s, record, _result([]), list(ts.pending), T0, PriceTable())


def test_a_due_thread_older_than_the_published_ones_keeps_its_round_watermark() -> None:
    # More threads than the read model publishes: the oldest one falls out of `watermarks`, but
    # when it becomes due its round must still carry its watermark (a KeyError here failed the
    # user workflow's task over and over, and the thread was never sliced).
    s = UserMemoryState()
    state_ops.absorb_submit(s, SubmitEvent(event_id="old", turns=turns("old", 0, 2)), CFG, T0)
    for i in range(state_ops.MAX_PUBLISHED_THREADS):
        t = T0 + 100 + i
        event = SubmitEvent(event_id=f"e{i}", turns=turns(f"t{i}", 0, 2, t))
        state_ops.absorb_submit(s, event, CFG, t)
    assert "old" not in state_ops.watermarks(s)
    assert state_ops.due_thread(s, CFG, T0 + 10**7) == "old"
    after = state_ops.round_watermarks(s, "old", list(s.threads["old"].pending))
    assert after["old"] == Watermark(accepted=2, indexed=2)
    assert len(after) == state_ops.MAX_PUBLISHED_THREADS + 1


def test_profile_facts_carry_their_fragments_and_leave_with_the_last_one() -> None:
    s = UserMemoryState(
        context=InjectedContext(
            user_id="u",
            version=3,
            fragments=[
                ContextFragment(id="f1", theme="t", types=["fact"], content="a"),
                ContextFragment(id="f2", theme="t", types=["fact"], content="b"),
            ],
        )
    )
    first = [FragmentRef(id="f1", created_at=T0, seq=1)]
    ada = UserProfile(name="Ada", goals=["run a marathon"], business_fields={"order": "7734"})
    state_ops.induction_stored(s, first, InductOutput(profile=ada, inducted=["f1"]), PriceTable())
    second = [FragmentRef(id="f2", created_at=T0, seq=2)]
    more = ada.model_copy(update={"goals": ["run a marathon", "learn Welsh"]})
    state_ops.induction_stored(s, second, InductOutput(profile=more, inducted=["f2"]), PriceTable())
    assert state_ops.forget_fragment_facts(s, "f2") == 1  # only "learn Welsh" came from f2
    assert s.profile.goals == ["run a marathon"] and s.profile.name == "Ada"
    assert [f.id for f in s.context.fragments] == ["f1"] and s.context.version == 4
    assert s.context.profile == s.profile
    assert state_ops.forget_fragment_facts(s, "f1") == 3
    assert s.profile == UserProfile() and not s.profile_sources
    # An induction that ran while its fragment was forgotten drops what came from it.
    late = [FragmentRef(id="f9", created_at=T0, seq=9)]
    s.forgotten_fragments.append("f9")
    out = InductOutput(profile=UserProfile(name="Ghost"), inducted=["f9"])
    state_ops.induction_stored(s, late, out, PriceTable())
    assert s.profile.name is None


def _refs(*ids: str) -> list[FragmentRef]:
    return [FragmentRef(id=i, created_at=T0, seq=n) for n, i in enumerate(ids, start=1)]


def test_facts_leave_with_the_fragment_that_states_them_whatever_the_batch() -> None:
    s = UserMemoryState()
    batch = _refs("f1", "f2", "f3")
    ada = UserProfile(name="Ada", goals=["learn Welsh"], hobbies=["chess"])
    stated = {"name\x1fAda": ["f1"], "goals\x1flearn Welsh": ["f2"], "hobbies\x1fchess": []}
    out = InductOutput(profile=ada, inducted=["f1", "f2", "f3"], fact_sources=stated)
    state_ops.induction_stored(s, batch, out, PriceTable(), by_statement=True)
    assert s.profile_sources["hobbies\x1fchess"] == ["f1", "f2", "f3"]  # could not be told
    # f1 alone states the name: it goes; "chess" might be f1's too: it goes (privacy first),
    # and the rest of its batch is inducted again so what they state comes back.
    assert state_ops.forget_fragment_facts(s, "f1", by_statement=True) == 2
    assert s.profile == UserProfile(goals=["learn Welsh"])
    assert [(r.id, r.seq) for r in s.uninducted] == [("f2", 0), ("f3", 0)]
    assert state_ops.mature_for_induction(s, CFG, T0) == s.uninducted  # due at once
    # A restatement adds its fragment: the fact stays while one that states it is kept.
    again = InductOutput(
        profile=s.profile, inducted=["f4"], fact_sources={"goals\x1flearn Welsh": ["f4"]}
    )
    state_ops.induction_stored(s, _refs("f4"), again, PriceTable(), by_statement=True)
    assert s.profile_stated["goals\x1flearn Welsh"] == ["f2", "f4"]
    assert state_ops.forget_fragment_facts(s, "f2", by_statement=True) == 0
    assert state_ops.forget_fragment_facts(s, "f4", by_statement=True) == 1
    assert s.profile == UserProfile() and not s.profile_sources and not s.profile_stated


def test_a_row_rewritten_without_a_forgotten_line_is_inducted_again() -> None:
    """Its facts leave it (a fact it alone stated goes, as when a fragment is forgotten), it is
    queued for induction again so what it still says comes back, the published context shows
    its new content, and no round is vouched for any more."""
    s = UserMemoryState()
    ada = UserProfile(name="Ada", hobbies=["chess"])
    stated = {"name\x1fAda": ["f1"], "hobbies\x1fchess": ["f1", "f2"]}
    out = InductOutput(profile=ada, inducted=["f1", "f2"], fact_sources=stated)
    state_ops.induction_stored(s, _refs("f1", "f2"), out, PriceTable(), by_statement=True)
    old = ContextFragment(id="f1", theme="t", types=[], content="User: I'm Ada.\nUser: Chess!")
    s.context = InjectedContext(user_id="u", version=3, fragments=[old])
    s.recent, s.recent_from = [old], 1
    now = old.model_copy(update={"content": "User: Chess!"})
    state_ops.rewritten(s, [Fragment(**{**now.model_dump(), "user_id": "u", "created_at": T0,
                                        "reinforced_at": T0})], by_statement=True)  # fmt: skip
    assert s.profile == UserProfile(hobbies=["chess"])  # f2 still states it
    assert [r.id for r in s.uninducted] == ["f1"]
    assert s.context.fragments[0].content == "User: Chess!" and s.context.version == 4
    assert (s.recent, s.recent_from) == ([], 0)
    assert "f1" not in s.forgotten_fragments


def test_an_induction_that_ran_across_a_forget_keeps_it_forgotten() -> None:
    s = UserMemoryState()
    first = InductOutput(
        profile=UserProfile(name="Ada"), inducted=["f1"], fact_sources={"name\x1fAda": ["f1"]}
    )
    state_ops.induction_stored(s, _refs("f1"), first, PriceTable(), by_statement=True)
    started_from = s.profile  # the next induction starts from this profile ...
    assert state_ops.forget_fragment_facts(s, "f1", by_statement=True) == 1
    # ... and returns it merged: the name it started from is not brought back.
    merged = started_from.model_copy(update={"hobbies": ["chess"]})
    late = InductOutput(
        profile=merged, inducted=["f2", "f3"], fact_sources={"hobbies\x1fchess": ["f3"]}
    )
    assert state_ops.induced_profile(s, _refs("f2", "f3"), late) == UserProfile(hobbies=["chess"])
    s.forgotten_fragments.append("f3")  # and f3 was forgotten while it ran
    assert state_ops.induced_profile(s, _refs("f2", "f3"), late) == UserProfile()
    state_ops.induction_stored(s, _refs("f2", "f3"), late, PriceTable(), by_statement=True)
    assert s.profile == UserProfile() and not s.profile_sources


def test_a_batch_refused_for_good_halves_then_skips_one_fragment() -> None:
    s = UserMemoryState(uninducted=_refs("f1", "f2", "f3", "f4"))
    state_ops.induction_refused(s, s.uninducted[:4], "too long")
    assert s.induction_batch_limit == 2 and len(s.uninducted) == 4
    state_ops.induction_refused(s, s.uninducted[:2], "too long")
    assert s.induction_batch_limit == 1
    state_ops.induction_refused(s, s.uninducted[:1], "too long")
    assert [r.id for r in s.uninducted] == ["f2", "f3", "f4"] and s.induction_skipped == 1
    assert s.last_error is not None and "skipped fragment f1" in s.last_error
    for expected in (2, 4, 0, 0):  # grows back after stored inductions
        state_ops.induction_grows(s, 8)
        assert s.induction_batch_limit == expected


def _failed_row(round_no: int, n: int, size: int = 10) -> Fragment:
    return Fragment(
        id=f"u:{round_no}:{n}",
        user_id="u",
        theme="t",
        types=[],
        content=f"User: {chr(65 + n % 26) * size}",
        created_at=T0,
        reinforced_at=T0,
        round_no=round_no,
        thread_id="t",
        start_pos=2 * n,
        end_pos=2 * n + 2,
    )


def test_swept_rows_are_kept_newest_last_bounded_by_count_and_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rows read before a sweep travel in the continue-as-new input: bounded."""
    s = UserMemoryState()
    monkeypatch.setattr(state_ops, "MAX_SWEPT_ROWS", 3)
    kept = state_ops.keep_swept_rows(s, "t", [_failed_row(1, n) for n in range(5)], {1})
    assert [r.id for r in s.swept_rows] == ["u:1:2", "u:1:3", "u:1:4"]
    assert kept == s.swept_rows
    monkeypatch.setattr(state_ops, "MAX_SWEPT_BYTES", 2 * len(_failed_row(2, 0, 100).content))
    state_ops.keep_swept_rows(s, "t", [_failed_row(2, n, 100) for n in range(3)], {2})
    assert [r.id for r in s.swept_rows] == ["u:2:1", "u:2:2"]
    state_ops.forget_all(s)
    assert s.swept_rows == []


def test_a_swept_row_follows_its_lines_to_the_round_that_sweeps_its_sweeper() -> None:
    """Round 2 swept round 1's rows and failed too: round 3 sweeps round 2's rows, where the
    kept row's lines were stored again, so the kept row is now swept by round 3. A read of the
    same row again (its round failed before sweeping) replaces it, not twice."""
    s = UserMemoryState()
    for row in state_ops.keep_swept_rows(s, "t", [_failed_row(1, 0), _failed_row(1, 1)], {1}):
        row.swept_by = 2
    other = state_ops.keep_swept_rows(s, "o", [_failed_row(7, 5)], {7})
    other[0].swept_by = 2  # another thread's round 2 (numbers are the user's: not in practice)
    moved = state_ops.keep_swept_rows(s, "t", [], {1, 2})
    assert sorted(r.id for r in moved) == ["u:1:0", "u:1:1"]
    again = state_ops.keep_swept_rows(s, "t", [_failed_row(1, 1)], {1})
    assert [r.id for r in again] == ["u:1:1"] and again[0].swept_by == 0
    assert [r.id for r in s.swept_rows] == ["u:1:0", "u:7:5", "u:1:1"]
    found = state_ops.swept_row(s, "u:1:0")
    assert found is not None
    as_row = state_ops.as_fragment(found, "u")
    assert (as_row.content, as_row.start_pos, as_row.end_pos) == (_failed_row(1, 0).content, 0, 2)
    state_ops.drop_swept_row(s, "u:1:0")
    assert state_ops.swept_row(s, "u:1:0") is None
