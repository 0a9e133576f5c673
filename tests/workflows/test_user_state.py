"""The user workflow's run object and its pure helpers, without a server: inbox order, session
end, config changes, forgetting, and explicit facts in the published context."""

from __future__ import annotations

import pytest

from mnemoflow.models.config import PRESETS, MemoryConfig, Vocation
from mnemoflow.models.contracts import (
    ContextFragment,
    FragmentRef,
    InjectedContext,
    ReinforceEvent,
    SubmitEvent,
    UserMemoryInput,
)
from mnemoflow.models.fragments import theme_key
from mnemoflow.models.turns import ChatTurn
from mnemoflow.workflows import state_ops
from mnemoflow.workflows.remembered import with_remembered
from mnemoflow.workflows.user_state import UserRun, absorb

T0 = 1_700_000_000.0


def turns(thread: str, n: int) -> list[ChatTurn]:
    return [
        ChatTurn(thread_id=thread, position=p, role="human", content=f"m{p}", time=T0)
        for p in range(n)
    ]


def fresh_run(**config: object) -> UserRun:
    cfg = MemoryConfig.from_vocation("customer service", **config)
    return UserRun.start(UserMemoryInput(user_id="u", config=cfg))


def test_consolidate_sent_right_after_a_hand_over_sees_its_turns() -> None:
    run = fresh_run()
    run.submits.append(SubmitEvent(event_id="e1", turns=turns("a", 3)))
    run.consolidations.append("a")
    absorb(run, T0)
    assert not run.has_input()
    assert state_ops.due_thread(run.state, run.config, T0) == "a"  # not 14 minutes later
    assert run.state.threads["a"].trigger == "consolidate"


def test_consolidate_keeps_a_failed_rounds_back_off_and_ignores_empty_threads() -> None:
    run = fresh_run()
    run.submits.append(SubmitEvent(event_id="e1", turns=turns("a", 2)))
    absorb(run, T0)
    run.state.threads["a"].not_before = T0 + 600
    assert state_ops.schedule_consolidation(run.state, "a") == 2
    assert state_ops.due_thread(run.state, run.config, T0 + 1) is None
    assert state_ops.due_thread(run.state, run.config, T0 + 600) == "a"
    assert state_ops.schedule_consolidation(run.state, "unknown") == 0
    assert "unknown" not in run.state.threads


def test_a_config_change_applies_at_absorb_and_travels_into_continue_as_new() -> None:
    run = fresh_run()
    run.config_change = run.config.updated(Vocation.ACCOMPANY, {"top_k": 9})
    assert run.has_input()
    absorb(run, T0)
    assert run.config.vocation == Vocation.ACCOMPANY and run.config_change is None
    carried = UserRun.start(run.continued_input())
    assert carried.config == run.config and carried.state == run.state


def test_config_updates_name_every_bad_field_and_keep_preset_fields_honest() -> None:
    cfg = MemoryConfig.from_vocation("customer service")
    accompany = cfg.updated("accompany")
    assert accompany.slice_gate == PRESETS[Vocation.ACCOMPANY].slice_gate
    assert accompany.top_k == cfg.top_k  # fields outside the preset are kept
    assert cfg.updated(params={"tau_m": 60}).vocation == Vocation.CUSTOM
    assert cfg.updated(params={"top_k": 6}).vocation == Vocation.CUSTOMER_SERVICE
    with pytest.raises(ValueError, match="unknown memory config fields: a, b"):
        cfg.updated(params={"b": 1, "a": 2})
    with pytest.raises(ValueError, match=r"slice_gate.*top_k|top_k.*slice_gate"):
        cfg.updated(params={"slice_gate": 2, "top_k": 0})
    with pytest.raises(ValueError):
        cfg.updated("astronaut")


def test_remembered_fragments_and_reinforcements_are_absorbed_in_order() -> None:
    run = fresh_run()
    run.remembered += [FragmentRef(id=f"x{i}", created_at=T0, seq=0) for i in range(3)]
    run.reinforcements.append(ReinforceEvent(call_id="c1", fragment_ids=["x0"]))
    absorb(run, T0)
    assert [(r.id, r.seq) for r in run.state.uninducted] == [("x0", 1), ("x1", 2), ("x2", 3)]
    run.dropped_ids.append("x1")
    absorb(run, T0)
    assert [r.id for r in run.state.uninducted] == ["x0", "x2"]
    assert len(run.state.pending_reinforce) == 1


def test_forget_all_clears_what_could_come_back_and_keeps_identities_seen() -> None:
    run = fresh_run()
    run.submits.append(SubmitEvent(event_id="e1", turns=turns("a", 4)))
    run.reinforcements.append(ReinforceEvent(call_id="c1", fragment_ids=["f"]))
    absorb(run, T0)
    run.state.context = InjectedContext(user_id="u", version=3)
    assert state_ops.forget_all(run.state) == 5  # four turns and one reinforcement
    ts = run.state.threads["a"]
    assert (ts.pending, ts.accepted, ts.indexed) == ([], 0, 0)
    assert run.state.context is None and not run.state.pending_reinforce
    run.submits.append(SubmitEvent(event_id="e2", turns=turns("a", 4)))  # a re-send
    absorb(run, T0)
    assert not ts.pending


def fragment(fid: str, score: float = 0.0) -> ContextFragment:
    return ContextFragment(id=fid, theme="t", types=["fact"], content=fid, score=score)


def test_a_remembered_fact_goes_first_at_the_best_score_once() -> None:
    base = InjectedContext(user_id="u", version=4, fragments=[fragment("a", 0.9), fragment("b")])
    out = with_remembered(base, fragment("m"), T0)
    assert [f.id for f in out.fragments] == ["m", "a", "b"]
    assert out.fragments[0].score == 0.9 and out.version == 5 and out.generated_at == T0
    again = with_remembered(out, fragment("m"), T0, limit=2)
    assert [f.id for f in again.fragments] == ["m", "a"] and again.version == 6
    empty = with_remembered(InjectedContext(user_id="u"), fragment("m", 0.2), T0)
    assert [(f.id, f.score) for f in empty.fragments] == [("m", 0.2)]


def test_one_theme_key_for_cache_and_cap() -> None:
    assert theme_key("  Travel   Plans ") == theme_key("travel plans") == "travel plans"
    assert theme_key("STRASSE") == theme_key("Straße")  # casefold, not lower
    assert len(theme_key("x" * 500)) == 200
