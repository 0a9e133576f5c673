"""Pure rules of middleware/window.py behind the edge cases of tests/middleware/test_turn_edges.py:
owners of unstamped messages, identities, unusable time stamps, nested thread keys."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from mnemoflow.middleware.window import (
    IDENTITY_KEY,
    OWNER_KEY,
    UNKNOWN_OWNER,
    message_identity,
    message_owners,
    message_time,
    nested_path,
    owner_of,
    resolve_thread_id,
    stamp_messages,
    to_turns,
)
from mnemoflow.models.turns import MAX_MESSAGE_ID_CHARS

T0 = 1_700_000_000.0
ADA, BOB = owner_of("ada"), owner_of("bob")


def _mine(text: str, owner: str, ident: str) -> HumanMessage:
    return HumanMessage(text, id=ident, additional_kwargs={"time": T0, OWNER_KEY: owner})


def test_an_unstamped_message_is_claimed_only_by_the_user_it_must_belong_to() -> None:
    msgs = [
        HumanMessage("failed first turn", id="f0"),  # before Ada's: Ada's, or Bob's?
        _mine("Ada's line", ADA, "a1"),
        AIMessage("Ada's reply", id="a2", additional_kwargs={"time": T0, OWNER_KEY: ADA}),
        HumanMessage("Ada's failed turn", id="a3"),  # after Ada's: Ada's or Bob's input?
        AIMessage("its partial reply", id="a4"),
        HumanMessage("Bob's new input", id="b1"),  # the current turn's input: the user's
        AIMessage("reply to it", id="b2"),
    ]
    unknown = UNKNOWN_OWNER
    assert message_owners(msgs, BOB) == [unknown, ADA, ADA, unknown, unknown, BOB, BOB]
    assert [t.message_id for t in to_turns(msgs, "th", T0, "bob")] == ["b1", "b2"]
    assert [t.message_id for t in to_turns(msgs, "th", T0, "ada")] == [
        "f0",
        "a1",
        "a2",
        "a3",
        "a4",
        "b1",
        "b2",
    ]  # Ada asking now: every unstamped line is hers
    stamped = {m.id: m.additional_kwargs[OWNER_KEY] for m in stamp_messages(msgs, T0, BOB)}
    assert stamped == {"f0": unknown, "a3": unknown, "a4": unknown, "b1": BOB, "b2": BOB}
    # Once stamped nobody's, nobody's for every later turn, Ada's included.
    restamped = {m.id: m for m in stamp_messages(msgs, T0, BOB)}
    later = [restamped.get(m.id, m) for m in msgs] + [HumanMessage("Ada again", id="a5")]
    assert [t.message_id for t in to_turns(later, "th", T0, "ada")] == ["a1", "a2", "a5"]

    # Another user's question is the latest: what follows it unstamped (a note other
    # middleware added after memory's last hook) was added in that user's turn, not this one's.
    note = AIMessage("note after Bob's turn", id="n1")
    after_bob = [*msgs[:3], _mine("Bob asks", BOB, "b3"), note]
    assert message_owners(after_bob, ADA)[-1] == unknown
    assert message_owners(after_bob, BOB)[-1] == BOB
    # A list nobody else stamped: unstamped head lines are the user's (a failed first turn).
    alone = [HumanMessage("failed first", id="g0"), _mine("Ada's next", ADA, "g1")]
    assert message_owners(alone, ADA) == [ADA, ADA]
    assert message_owners(alone, BOB) == [unknown, ADA]


def test_identity_carries_the_text_first_seen_and_survives_a_later_edit() -> None:
    turn1 = stamp_messages([HumanMessage("line one", id="user-input")], T0, ADA)[0]
    turn2 = stamp_messages([HumanMessage("line two", id="user-input")], T0, ADA)[0]
    again = stamp_messages([HumanMessage("line one", id="user-input")], T0 + 9, ADA)[0]
    assert message_identity(turn1) != message_identity(turn2)
    assert message_identity(turn1) == message_identity(again)  # re-sent unchanged: the same
    edited = turn1.model_copy(update={"content": "line ###"})  # redaction keeps the kwargs
    assert message_identity(edited) == message_identity(turn1)
    assert message_identity(turn1).startswith("user-input#")
    # Never stamped (a checkpoint from before identities): the id alone, as it was accepted.
    assert message_identity(HumanMessage("x", id="old")) == "old"
    assert message_identity(ToolMessage("42", tool_call_id="call-7")) == "tool:call-7"


@pytest.mark.parametrize("ident", ["h-\udfff", "\U0001f99c\ud83d-id", "i" * 50_000])
def test_an_unusable_id_gives_an_encodable_bounded_identity(ident: str) -> None:
    msg = stamp_messages([HumanMessage("text", id=ident)], T0, ADA)[0]
    for identity in (message_identity(msg), message_identity(HumanMessage("t", id=ident))):
        identity.encode("utf-8")
        assert 0 < len(identity) <= MAX_MESSAGE_ID_CHARS
    other = stamp_messages([HumanMessage("text", id=ident + "x")], T0, ADA)[0]
    assert message_identity(msg) != message_identity(other)
    bad = msg.model_copy(update={"additional_kwargs": {**msg.additional_kwargs, IDENTITY_KEY: 7}})
    assert message_identity(bad) == message_identity(HumanMessage("t", id=ident))


@pytest.mark.parametrize("stamp", [0, 0.0, -1.0, "0", math.inf, -math.inf, math.nan, True, "x"])
def test_a_non_positive_or_non_finite_stamp_is_no_stamp(stamp: object) -> None:
    msg = HumanMessage("x", id="1", additional_kwargs={"time": stamp})
    assert message_time(msg) is None
    assert stamp_messages([msg], T0)[0].additional_kwargs["time"] == T0
    assert message_time(HumanMessage("x", additional_kwargs={"time": T0})) == T0


def test_a_nested_graph_keys_a_thread_of_its_own() -> None:
    assert nested_path("model:1f2e") == ""
    assert nested_path("") == ""
    assert nested_path("tools:9fef|model:3fcd") == "tools"
    assert nested_path("tools:9fef|tools:77aa|Memory.before_agent:b0fc") == "tools/tools"

    def runtime(ns: str) -> SimpleNamespace:
        return SimpleNamespace(execution_info=SimpleNamespace(thread_id="par", checkpoint_ns=ns))

    top = resolve_thread_id(runtime("model:03b9"))
    assert top == "par"
    sub = resolve_thread_id(runtime("tools:9fef|model:3fcd"))
    assert sub != top and sub == resolve_thread_id(runtime("tools:1234|model:5678"))
    assert resolve_thread_id(runtime("model:1")) == resolve_thread_id(runtime(""))
