"""The memory budget holds for what is rendered, and packing never prefers a stale fact.

Adversarial inputs an earlier probe found: an update dropped as a near-duplicate of the fact it
updates, fragments still in the window taking the budget's room, a published-context fallback
and a profile injected with no budget, and rendering costing more than packing counted.
"""

from __future__ import annotations

import random

import pytest

from mnemoflow.memory.prompt import (
    PROFILE_SHARE,
    assemble_system_prompt,
    budget_tokens,
    fit_profile,
    memory_tokens,
    profile_section,
    render_profile,
)
from mnemoflow.memory.search import (
    SearchDoc,
    SearchIndex,
    choose_fragments,
    fragment_cost,
    pack,
)
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment, InjectedContext
from mnemoflow.models.profile import UserProfile

NOW = 1_700_000_000.0
DAY = 86400.0
CORE = "You are a helpful assistant."


def _frag(fid: str, content: str, said: float, thread: str = "t0", **kw: object) -> ContextFragment:
    values: dict[str, object] = {"theme": "t", "types": ["fact"], "start_pos": 0, "end_pos": 2}
    values.update(kw)
    return ContextFragment(
        id=fid,
        content=content,
        created_at=said,
        thread_id=thread,
        **values,  # type: ignore[arg-type]
    )


def _memory_section(profile: UserProfile, fragments: list[ContextFragment], budget: int) -> str:
    """What the middleware's system prompt carries beyond the core prompt."""
    prompt = assemble_system_prompt(CORE, profile, fragments, budget)
    assert prompt.startswith(CORE)
    return prompt[len(CORE) :]


# 1. An updated fact does not lose to the stale one.


def test_a_changed_number_or_negation_is_never_a_near_duplicate() -> None:
    base = "User: please send my parcel to {} Elm Street, Springfield, flat 3B, thanks a lot"
    old = _frag("old", base.format(12), NOW - 30 * DAY)
    new = _frag("new", base.format(14), NOW - DAY)
    assert [f.id for f in pack([old, new], budget=1000)] == ["old", "new"]

    vegan = _frag(
        "a", "User: I am vegan and I eat tofu every single day of the week", NOW - 9 * DAY
    )
    not_vegan = _frag("b", "User: I am not vegan and I eat tofu every single day of the week", NOW)
    assert [f.id for f in pack([vegan, not_vegan], budget=1000)] == ["a", "b"]

    likes = _frag("c", "User: 我喜欢吃芒果和香蕉，每天早上都吃", NOW - 9 * DAY)
    dislikes = _frag("d", "User: 我不喜欢吃芒果和香蕉，每天早上都吃", NOW)
    assert [f.id for f in pack([likes, dislikes], budget=1000)] == ["c", "d"]


def test_of_two_near_duplicates_the_newer_one_is_kept_in_place() -> None:
    old = _frag("old", "User: My daughter Lily plays the violin every evening.", NOW - 30 * DAY)
    echo = _frag("echo", "user: my daughter Lily plays the violin every evening!", NOW - DAY)
    other = _frag("other", "User: Lily's violin teacher is Mr Park.", NOW - 5 * DAY)
    assert [f.id for f in pack([old, other, echo], budget=1000)] == ["echo", "other"]
    # an older near-duplicate ranked after the newer one adds nothing
    assert [f.id for f in pack([echo, other, old], budget=1000)] == ["echo", "other"]


def test_the_updated_address_is_injected_first() -> None:
    text = "User: please ship my order to my new address {} Elm Street, apartment 3B"
    old = _frag("old", text.format(12), NOW - 30 * DAY, thread="t1")
    new = _frag("new", text.format(14), NOW - DAY, thread="t2")
    index = SearchIndex([SearchDoc(old, old.created_at), SearchDoc(new, new.created_at)])
    query = "what is my shipping address?"
    config = MemoryConfig()
    chosen = choose_fragments(
        index.excerpts(query, None, config, NOW), None, "t3", None, query, config
    )
    assert [f.id for f in chosen] == ["new", "old"]  # both: a changed number is no repeat
    assert "14 Elm Street" in chosen[0].content


# 2. Fragments still in the window do not take the budget's room.


def test_fragments_in_the_window_do_not_crowd_out_older_memory() -> None:
    old = _frag("old", "User: I'm allergic to mango, it gives me hives", NOW - 90 * DAY)
    recent = [
        _frag(
            f"w{i}",
            "\n".join(f"User: mango smoothie recipe step {i}-{j} with mango" for j in range(5)),
            NOW - 3600 + i,
            thread="t1",
            start_pos=5 * i,
            end_pos=5 * i + 5,
            types=["chat"],
        )
        for i in range(40)
    ]
    index = SearchIndex([SearchDoc(f, f.created_at) for f in [old, *recent]])
    config = MemoryConfig()
    query = "can I eat mango?"
    found = index.excerpts(query, None, config, NOW)
    assert "old" not in [f.id for f in found]  # the recent ones filled the budget
    chosen = choose_fragments(found, None, "t1", NOW - 7200, query, config)
    assert [f.id for f in chosen] == ["old"]
    assert "allergic to mango" in chosen[0].content


def test_when_everything_found_is_in_the_window_the_published_context_is_used() -> None:
    recent = _frag("w", "User: mango smoothie with mango", NOW - 60, thread="t1")
    published = _frag("p", "User: I'm allergic to mango", NOW - 90 * DAY)
    index = SearchIndex([SearchDoc(recent, recent.created_at)])
    context = InjectedContext(user_id="u", fragments=[recent, published], top_k=4)
    config = MemoryConfig()
    found = index.excerpts("mango", None, config, NOW)
    assert [f.id for f in found] == ["w"]
    chosen = choose_fragments(found, context, "t1", NOW - 3600, "mango", config)
    assert [f.id for f in chosen] == ["p"]


# 3. The memory section never exceeds its budget.


def test_the_published_fallback_is_packed_into_the_budget() -> None:
    # four fragments of ~1,000 tokens each: 4,051 tokens against 1,200 before
    big = [_frag(f"b{i}", "User: mango " + "z" * 4000, NOW - DAY) for i in range(4)]
    small = _frag("s", "User: mango is fine for me", NOW - DAY)
    context = InjectedContext(user_id="u", fragments=[*big, small], top_k=5)
    config = MemoryConfig()
    chosen = choose_fragments(None, context, "x", None, "mango", config)
    assert [f.id for f in chosen] == ["b0", "s"]  # one big one fits, the small one next to it
    assert budget_tokens(_memory_section(UserProfile(), chosen, 1200)) <= 1200
    # still no more than the published top_k
    few = context.model_copy(update={"top_k": 1})
    assert [f.id for f in choose_fragments(None, few, "x", None, "mango", config)] == ["b0"]


def test_a_turn_longer_than_the_budget_is_skipped_in_search_and_fallback_alike() -> None:
    huge = _frag("h", "User: " + "word " * 5000 + "mango allergy", NOW - DAY)
    config = MemoryConfig()
    found = SearchIndex([SearchDoc(huge, huge.created_at)]).excerpts(
        "mango allergy", None, config, NOW
    )
    assert found == []
    context = InjectedContext(user_id="u", fragments=[huge], top_k=4)
    assert choose_fragments(found, context, "x", None, "mango allergy", config) == []
    # with something that fits next to it, that is injected instead of nothing
    ok = _frag("ok", "User: my mango allergy is mild", NOW - 2 * DAY)
    context = InjectedContext(user_id="u", fragments=[huge, ok], top_k=4)
    chosen = choose_fragments(found, context, "x", None, "mango allergy", config)
    assert [f.id for f in chosen] == ["ok"]


def test_the_profile_is_cut_to_its_share_most_important_facts_first() -> None:
    profile = UserProfile(
        name="Ana",
        constraints=["allergic to mango"],
        hobbies=[f"hobby {i} " + "h" * 60 for i in range(12)],
        business_fields={f"k{i:02}": "x" * 200 for i in range(40)},
    )
    assert budget_tokens(profile_section(profile)) > 1200
    fitted = fit_profile(profile, 600)
    assert budget_tokens(profile_section(fitted)) <= 600
    text = render_profile(fitted)
    assert text.startswith("- Name: Ana\n- Constraints: allergic to mango\n")
    # business fields before hobbies, in key order; the rest left out whole, never cut
    assert "K00" in text and "Hobbies" not in text
    kept = sorted(fitted.business_fields)
    assert kept == [f"k{i:02}" for i in range(len(kept))]
    assert all(v == "x" * 200 for v in fitted.business_fields.values())
    # the same profile and budget give the same bytes (the provider's cache)
    assert render_profile(fit_profile(profile, 600)) == text
    # a list keeps its newest items when only some fit
    many = UserProfile(hobbies=[f"hobby number {i}" for i in range(12)])
    some = fit_profile(many, 30)
    assert some.hobbies and some.hobbies == many.hobbies[-len(some.hobbies) :]
    # a profile that fits is left as it is
    assert fit_profile(UserProfile(name="Ana"), 600) == UserProfile(name="Ana")


def test_a_huge_profile_leaves_the_fragments_their_share() -> None:
    profile = UserProfile(business_fields={f"k{i}": "x" * 200 for i in range(40)})
    context = InjectedContext(user_id="u", profile=profile)
    config = MemoryConfig()
    found = [_frag("f", "User: my dog is Rex", NOW - DAY)]
    chosen = choose_fragments(found, context, "other", None, "dog", config)
    assert [f.id for f in chosen] == ["f"]
    section = _memory_section(profile, chosen, config.memory_budget_tokens)
    assert budget_tokens(section) <= config.memory_budget_tokens
    assert "my dog is Rex" in section
    profile_part = section.split("## Relevant memories")[0]
    assert budget_tokens(profile_part) <= PROFILE_SHARE * config.memory_budget_tokens


def test_fragment_cost_is_what_its_item_renders_to() -> None:
    frag = _frag("x", "User: a\n\nAssistant: b\n  c  ", NOW, types=["identity", "decision"])
    one = memory_tokens(UserProfile(), [frag])
    two = memory_tokens(UserProfile(), [frag, frag])
    assert two - one in {
        fragment_cost(frag, 2) - 1,
        fragment_cost(frag, 2),
        fragment_cost(frag, 2) + 1,
    }
    rendered = assemble_system_prompt(CORE, UserProfile(), [frag])[len(CORE) :]
    assert memory_tokens(UserProfile(), [frag]) == budget_tokens(rendered)


_WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
_TYPES = ["identity", "decision", "preference", "fact", "episode", "chat"]


def _adversarial(kind: str, rng: random.Random) -> tuple[list[SearchDoc], UserProfile, str]:
    docs: list[ContextFragment] = []
    profile = UserProfile()
    if kind == "cjk":
        for i in range(60):
            lines = [
                f"User: 我的女儿{i}号喜欢小提琴和芒果，她每天练习{j}个小时"
                if j % 2 == 0
                else f"Assistant: 好的，我记住了：{'芒果' * rng.randint(1, 30)}"
                for j in range(8)
            ]
            docs.append(
                _frag(
                    f"c{i}",
                    "\n".join(lines),
                    NOW - i * DAY,
                    thread="c",
                    start_pos=8 * i,
                    end_pos=8 * i + 8,
                )
            )
        query = "我的女儿喜欢什么？芒果"
    elif kind == "huge":
        docs.append(
            _frag("h", "User: " + " ".join(rng.choice(_WORDS) for _ in range(3000)), NOW - DAY)
        )
        docs.append(_frag("s", "User: alpha bravo is my favourite", NOW - 2 * DAY, thread="s"))
        query = "alpha bravo"
    elif kind == "tiny":
        for i in range(300):
            lines = [f"User: {_WORDS[i % 13]}{i}{j}\n  and more\n\n" for j in range(8)]
            docs.append(
                _frag(
                    f"t{i}",
                    "\n".join(lines),
                    NOW - i * 3600,
                    thread=f"th{i % 7}",
                    start_pos=8 * i,
                    end_pos=8 * i + 8,
                    types=_TYPES,
                    theme="customer billing and shipping | " + "y" * rng.randint(0, 40),
                )
            )
        query = " ".join(f"{_WORDS[i % 13]}{i}0" for i in range(300))
    else:  # a huge profile next to ordinary fragments
        profile = UserProfile(
            name="Ana " * 50,
            hobbies=[f"hobby {i} " + "h" * 80 for i in range(12)],
            business_fields={f"field_{i}": "我" * 100 + "x" * 100 for i in range(40)},
        )
        for i in range(50):
            lines = [f"User: {' '.join(rng.choice(_WORDS) for _ in range(20))}" for _ in range(6)]
            docs.append(
                _frag(
                    f"p{i}",
                    "\n".join(lines),
                    NOW - i * DAY,
                    thread="p",
                    start_pos=6 * i,
                    end_pos=6 * i + 6,
                )
            )
        query = "alpha bravo charlie"
    return [SearchDoc(d, d.created_at) for d in docs], profile, query


@pytest.mark.parametrize("kind", ["cjk", "huge", "tiny", "profile"])
@pytest.mark.parametrize("budget", [150, 600, 1200, 3000])
def test_the_rendered_memory_section_never_exceeds_the_budget(kind: str, budget: int) -> None:
    rng = random.Random(f"{kind}-{budget}")
    docs, profile, query = _adversarial(kind, rng)
    config = MemoryConfig(memory_budget_tokens=budget)
    index = SearchIndex(docs)
    context = InjectedContext(
        user_id="u", profile=profile, fragments=[d.fragment for d in docs[:8]], top_k=8
    )
    for found, window in [
        (index.excerpts(query, None, config, NOW), None),
        (index.excerpts(query, None, config, NOW), NOW - 5 * DAY),  # some in the window
        (None, None),  # the search missed its deadline: the published context
    ]:
        thread = docs[0].fragment.thread_id
        chosen = choose_fragments(found, context, thread, window, query, config)
        # what choose_fragments picked fits as it is, with the profile cut to its share
        fitted = fit_profile(profile, int(budget * PROFILE_SHARE))
        assert memory_tokens(fitted, chosen) <= budget
        # and the prompt the middleware writes carries all of it within the budget
        section = _memory_section(profile, chosen, budget)
        assert budget_tokens(section) <= budget
        assert all(f.content.strip().splitlines()[0] in section for f in chosen)


@pytest.mark.parametrize("kind", ["cjk", "tiny", "profile"])
def test_excerpts_count_what_is_rendered_and_use_the_budget(kind: str) -> None:
    docs, profile, query = _adversarial(kind, random.Random(kind))
    config = MemoryConfig()
    found = SearchIndex(docs).excerpts(query, None, config, NOW, profile=profile)
    fitted = fit_profile(profile, int(config.memory_budget_tokens * PROFILE_SHARE))
    used = memory_tokens(fitted, found)
    assert used <= config.memory_budget_tokens
    # counted as rendered, not under (nothing for packing to drop) nor far over (room left)
    # (packing may still drop a near-duplicate: the random lines of "profile" repeat words)
    unbounded = pack(found, 10**9, profile=fitted)
    assert pack(found, config.memory_budget_tokens, profile=fitted) == unbounded
    assert used >= config.memory_budget_tokens - 60


def test_fit_profile_never_exceeds_what_it_was_given() -> None:
    rng = random.Random(7)
    profile = UserProfile(
        name="安娜 Ana\nsecond line",
        occupation="   ",
        style="brief " * rng.randint(1, 20),
        constraints=["", "no mango", "不吃辣" * 5, "vegetarian\n(strict)"],
        relationships=[f"friend {i} 朋友" * rng.randint(1, 4) for i in range(12)],
        business_fields={" ": "hidden", "plan": "gold", "note": "备注" * 30, "empty": ""},
    )
    full = budget_tokens(profile_section(profile))
    for tokens in range(0, full + 2):
        fitted = fit_profile(profile, tokens)
        assert budget_tokens(profile_section(fitted)) <= max(tokens, 0)
        assert render_profile(fitted) == render_profile(fit_profile(profile, tokens))
    assert fit_profile(profile, full) == profile
