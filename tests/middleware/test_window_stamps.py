"""Pure rules of middleware/window.py for time stamps: units, datetimes and ISO strings, what an
unreadable stamp becomes, and the order of the stamps the middleware gives (the integration
tests are in tests/middleware/test_time_stamps.py)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta, timezone

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from mnemoflow.middleware import window
from mnemoflow.middleware.window import (
    MAX_STAMP_LEAD,
    TIME_KEY,
    legacy_identity,
    message_time,
    next_stamp,
    stamp_messages,
    stamp_times,
    to_turns,
)
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import SubmitEvent, UserMemoryState
from mnemoflow.models.turns import content_identity
from mnemoflow.workflows import state_ops

T0 = 1_796_000_000.25  # 2026-11-30


def stamped(value: object, text: str = "x") -> HumanMessage:
    return HumanMessage(text, id=f"m-{text}", additional_kwargs={TIME_KEY: value})


@pytest.mark.parametrize(
    "value",
    [T0, T0 * 1e3, T0 * 1e6, T0 * 1e9, int(T0 * 1e9), str(T0 * 1e3)],
    ids=["s", "ms", "us", "ns", "ns-int", "ms-str"],
)
def test_a_stamp_in_a_finer_unit_is_read_as_seconds(value: object) -> None:
    assert message_time(stamped(value)) == pytest.approx(T0, abs=1e-3)


def test_the_unit_bound_keeps_every_plausible_seconds_stamp() -> None:
    year_4999 = datetime(4999, 12, 31, tzinfo=UTC).timestamp()
    assert message_time(stamped(year_4999)) == year_4999
    assert message_time(stamped(1e18)) == 1e9  # 2001: any unit lands after 1973
    assert window.MAX_SECONDS_STAMP / 1000 < datetime(1974, 1, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    "value",
    [
        datetime.fromtimestamp(T0, UTC),
        datetime.fromtimestamp(T0, timezone(timedelta(hours=-5))),
        datetime.fromtimestamp(T0, UTC).replace(tzinfo=None),  # naive: UTC
        datetime.fromtimestamp(T0, UTC).isoformat(),
        datetime.fromtimestamp(T0, UTC).isoformat().replace("+00:00", "Z"),
        datetime.fromtimestamp(T0, timezone(timedelta(hours=9, minutes=30))).isoformat(),
        datetime.fromtimestamp(T0, UTC).replace(tzinfo=None).isoformat(),  # naive: UTC
        " " + datetime.fromtimestamp(T0, UTC).isoformat() + " ",
    ],
    ids=["aware", "aware-5h", "naive", "iso", "iso-z", "iso+0930", "iso-naive", "iso-spaces"],
)
def test_a_datetime_or_iso_stamp_is_its_utc_instant(value: object) -> None:
    msg = stamped(value)
    assert message_time(msg) == T0
    assert stamp_messages([msg], T0 + 500) == []  # kept as given, never overwritten
    assert to_turns([msg], "t", T0 + 500)[0].time == T0


@pytest.mark.parametrize(
    "value", ["yesterday", "2026-13-01", [T0], {"t": T0}, 10**400, "1e999", True, 0, -5.0]
)
def test_an_unreadable_stamp_is_logged_once_and_stamped_now(
    value: object, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(window, "_warned", set())
    caplog.set_level(logging.WARNING, logger=window.__name__)
    msgs = [stamped(value, "a"), stamped(value, "b")]
    assert [message_time(m) for m in msgs] == [None, None]
    assert [m.additional_kwargs[TIME_KEY] for m in stamp_messages(msgs, T0)] == [T0, T0]
    assert [t.time for t in to_turns(msgs, "t", T0)] == [T0, T0]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not a usable time" in warnings[0].getMessage()


def test_no_stamp_is_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=window.__name__)
    assert message_time(HumanMessage("x")) is None
    assert caplog.records == []


@pytest.mark.parametrize("value", [T0 * 1e3, "2026-11-30T00:00:00Z", "garbage"])
def test_identities_without_an_id_keep_hashing_the_stamp_as_given(value: object) -> None:
    """How stamps are read never changes the identity of a message without an id (a re-send of
    one delivered before would be accepted twice)."""
    msg = HumanMessage("no id", additional_kwargs={TIME_KEY: value})
    try:
        raw = float(value)  # type: ignore[arg-type]
    except ValueError:
        raw = 0.0
    assert legacy_identity(msg) == content_identity("human", "no id", raw)


def test_a_stamp_the_middleware_gives_is_never_before_the_stamps_before_it() -> None:
    """A caller's clock 30 s ahead stamps the question; the reply the middleware stamps with
    its own clock takes the question's time, so (time, position) keeps the list's order."""
    question = stamped(T0 + 30, "q")
    reply = AIMessage("a", id="r")
    later = HumanMessage("next", id="n")
    assert stamp_times([question, reply, later], T0) == [T0 + 30, T0 + 30, T0 + 30]
    assert next_stamp([question], T0) == T0 + 30
    assert next_stamp([question], T0 + 40) == T0 + 40  # the clock passed it: now
    assert next_stamp([], T0) == T0
    # a stamp before it that is behind the clock changes nothing
    assert stamp_times([stamped(T0 - 100, "old"), reply], T0) == [T0 - 100, T0]
    # only stamps before it: a later stamped message does not pull it forward
    assert stamp_times([reply, stamped(T0 + 30, "q")], T0) == [T0, T0 + 30]
    stamps = [m.additional_kwargs[TIME_KEY] for m in stamp_messages([question, reply, later], T0)]
    assert stamps == [T0 + 30, T0 + 30]
    # a stamp past the lead (a wrong date, not a skewed clock) holds nothing back
    far = stamped(T0 + MAX_STAMP_LEAD + 1, "far")
    assert stamp_times([far, reply], T0) == [T0 + MAX_STAMP_LEAD + 1, T0]
    assert next_stamp([stamped(T0 * 1e3 + 30e3, "ms")], T0) == pytest.approx(T0 + 30)


def test_a_round_of_a_skewed_caller_keeps_each_answer_after_its_question() -> None:
    """End to end without a server: the turns handed over, absorbed, and the round's batch."""
    msgs: list = []
    for n in range(3):
        now = T0 + 100 * n
        msgs.append(stamped(now + 30, f"q{n}"))  # the caller's clock, 30 s ahead
        msgs.append(AIMessage(f"a{n}", id=f"a{n}"))
        msgs.append(ToolMessage(f"t{n}", id=f"t{n}", tool_call_id=f"c{n}"))
        by_id = {m.id: m for m in stamp_messages(msgs, now)}
        msgs = [by_id.get(m.id, m) for m in msgs]
    turns = to_turns(msgs, "t", T0 + 300)
    s = UserMemoryState()
    state_ops.absorb_submit(s, SubmitEvent(event_id="e", turns=turns), MemoryConfig(), T0 + 300)
    batch = state_ops.round_batch(s.threads["t"], 64)
    assert [t.content for t in batch] == [window.message_text(m) for m in msgs]


def test_the_forget_epoch_is_stamped_once_on_messages_new_to_the_middleware() -> None:
    """docs/ARCHITECTURE.md, "Forget epochs": a message keeps the epoch of the turn that added
    it; one said before a forget never takes the epoch after it."""
    owner = window.owner_of("ana")
    old = HumanMessage("said before the forget", id="m1")
    [old] = window.stamp_messages([old], 100.0, owner, epoch=0)
    new = HumanMessage("said after it", id="m2")
    stamped = window.stamp_messages([old, new], 200.0, owner, epoch=1)
    assert [m.id for m in stamped] == ["m2"]
    turns = window.to_turns([old, stamped[0]], "t", 300.0, "ana")
    assert [t.epoch for t in turns] == [0, 1]
    unknown = window.stamp_messages([HumanMessage("epoch unknown", id="m3")], 1.0, owner)
    assert window.to_turns(unknown, "t", 2.0, "ana")[0].epoch is None
    for bad in (True, -1, "2", 1.5):
        assert (
            window.message_epoch(HumanMessage("x", additional_kwargs={"mnemoflow_epoch": bad}))
            is None
        )


def test_turns_known_accepted_are_skipped_and_the_rest_keep_their_place() -> None:
    """A turn offers only its new messages: those whose identity is known accepted are left
    out before they are built; the others are exactly what the whole conversion gives."""
    said = [
        HumanMessage(content=f"distinct line {n} about topic {n * 7}", id=f"m{n}")
        if n % 2 == 0
        else AIMessage(content=f"answer {n} on topic {n * 7}", id=f"m{n}")
        for n in range(9)
    ]
    stamped = stamp_messages(said, 1_700_000_000.0, "owner-a", 0)
    by_id = {m.id: m for m in stamped}
    messages = [by_id.get(m.id, m) for m in said]
    every = to_turns(messages, "t1", 1_700_000_100.0)
    known = {t.message_id for t in every[:6]}
    fresh = to_turns(messages, "t1", 1_700_000_100.0, skip=known)
    assert fresh == every[6:]
    assert [t.position for t in fresh] == [6, 7, 8]
    assert to_turns(messages, "t1", 1_700_000_100.0, skip=set()) == every
