"""The state rules behind tests/middleware/test_forget_late_turns.py (patch
`forget-covers-late-turns`): what a forget covers is refused or cut on arrival, and histories
recorded before the patch (the rule says no) keep such turns as they came."""

from __future__ import annotations

from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ForgetReceipt, SubmitEvent, UserMemoryState
from mnemoflow.models.turns import ChatTurn, turn_identity
from mnemoflow.workflows import state_ops

CFG = MemoryConfig.from_vocation("customer service")
T0 = 1_796_000_000.0
CODE = "The gate code of unit 7 is 7113, pass word ember1."


def turn(n: int, role: str, text: str, t: float, **extra: object) -> ChatTurn:
    return ChatTurn(
        thread_id="t", position=n, role=role, content=text, time=t, message_id=f"m{n}", **extra
    )  # type: ignore[arg-type]


def absorb(s: UserMemoryState, event: str, turns: list[ChatTurn], answer: bool) -> list[bool]:
    asked: list[bool] = []

    def rule() -> bool:
        asked.append(answer)
        return answer

    state_ops.absorb_submit(
        s, SubmitEvent(event_id=event, turns=turns), CFG, T0 + 100, True, None, rule
    )
    return asked


def forgotten() -> UserMemoryState:
    s = UserMemoryState()
    s.fence = T0 + 50
    s.forget_receipts.append(
        ForgetReceipt(
            user_id="u", at=s.fence, fragments_deleted=1, read_model_deleted=1,
            profile_cleared=True, events_dropped=0, rounds_cancelled=0,
        )
    )  # fmt: skip
    return s


def pending_texts(s: UserMemoryState) -> list[str]:
    return [t.content for t in s.threads["t"].pending] if "t" in s.threads else []


def test_a_turn_whose_question_the_fence_refused_is_refused_with_it() -> None:
    for answer, kept in ((True, []), (False, ["the reply made after the forget"])):
        s = forgotten()
        asked = turn(0, "human", "what is my code?", T0 + 10)
        reply = turn(1, "ai", "the reply made after the forget", T0 + 60, turn_of="m0")
        assert absorb(s, "e", [asked, reply], answer) == [answer]
        assert pending_texts(s) == kept
        assert s.refused_after_forget == (1 if answer else 0)


def test_a_pending_question_dropped_by_a_forget_takes_its_later_reply() -> None:
    s = UserMemoryState()
    absorb(s, "e1", [turn(0, "human", "what is my code?", T0 + 10)], True)
    state_ops.forget_all(s)
    s.fence = T0 + 50
    absorb(s, "e2", [turn(1, "ai", CODE, T0 + 60, turn_of="m0")], True)
    assert pending_texts(s) == []


def test_an_unstamped_copy_is_refused_only_once_the_user_was_forgotten() -> None:
    copy = turn(0, "human", "a copy from the app's database", T0 + 99, unstamped=True)
    fresh = UserMemoryState()
    assert absorb(fresh, "e", [copy], True) == []  # never forgotten: kept, nothing asked
    assert pending_texts(fresh) == [copy.content]
    s = forgotten()
    assert absorb(s, "e", [copy], True) == [True]
    assert pending_texts(s) == []
    old = forgotten()
    absorb(old, "e", [copy], False)  # a history from before the patch
    assert pending_texts(old) == [copy.content]


def test_words_a_reply_took_from_a_forgotten_fragment_are_cut_on_arrival_and_pending() -> None:
    s = UserMemoryState()
    quoting = turn(0, "ai", f"You said: {CODE} Anything else?", T0 + 10, quotes={"f1": [CODE]})
    absorb(s, "e1", [quoting], True)
    state_ops.forgotten_with_quotes(s, "f1")
    assert state_ops.replies_quoting(s, "f1")
    assert state_ops.cut_replies_quoting(s, "f1") == 1
    assert pending_texts(s) == ["You said: Anything else?"]
    assert s.threads["t"].pending[0].quotes == {}  # the words leave the stamp too
    late = turn(1, "ai", f"Again: {CODE}", T0 + 20, quotes={"f1": [CODE]})
    other = turn(2, "ai", f"Unrelated: {CODE}", T0 + 30, quotes={"f2": [CODE]})
    absorb(s, "e2", [late, other], True)
    assert pending_texts(s) == ["You said: Anything else?", "Again:", other.content]
    whole = turn(3, "ai", CODE, T0 + 40, quotes={"f1": [CODE]})
    absorb(s, "e3", [whole], True)
    assert len(pending_texts(s)) == 3 and s.refused_after_forget == 1
    assert turn_identity(whole) not in {turn_identity(t) for t in s.threads["t"].pending}


def test_an_unstamped_copy_of_a_line_forgotten_with_its_quotes_is_refused() -> None:
    s = UserMemoryState()
    state_ops.forgotten_lines(s, [CODE])
    again = turn(0, "human", f"  {CODE}\n", T0 + 99, unstamped=True)  # spacing aside
    other = turn(1, "human", "a line nobody forgot, copied", T0 + 99, unstamped=True)
    said = turn(2, "human", CODE, T0 + 99)  # said again, stamped: the user's new word
    assert absorb(s, "e", [again, other, said], True) == [True]
    assert pending_texts(s) == [other.content, CODE]
    assert CODE not in " ".join(s.forgotten_lines)  # digests, no words
