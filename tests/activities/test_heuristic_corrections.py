"""The offline inducer takes a correction's new value, so the stale one leaves the profile.

A first session states a value, a later one corrects it ("I moved from 12 Elm Street to 14 Elm
Street", "I'm no longer vegan", "I don't work as a nurse any more, I'm a paramedic now",
"我以前是老师，现在是律师"). The correction's update, merged as induction merges it, must hold the
new value and leave nothing of the old one: a scalar or business field is replaced, a list item
is replaced by its negation (memory.profile_merge.same_fact). The probe's phrasings, then held-out
ones in English and Chinese.
"""

from __future__ import annotations

import json

import pytest
from temporalio.testing import ActivityEnvironment

from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.activities.llm.heuristic_profile import extract_profile
from mnemoflow.activities.llm_activities import LLMActivities
from mnemoflow.memory.profile_merge import merge_profile
from mnemoflow.models.contracts import InductInput
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile


def _profile(*lines: str) -> UserProfile:
    return extract_profile(["\n".join(f"User: {line}" for line in lines)])


# (first statement, its correction, what the corrected profile holds, what it must not hold)
CORRECTIONS = [
    # found by the probe
    (
        "I live at 12 Elm Street, Springfield.",
        "I moved from 12 Elm Street to 14 Elm Street last week.",
        "14 Elm Street",
        "12 Elm",
    ),
    ("I am vegan.", "I'm no longer vegan.", "no longer vegan", '"vegan"'),
    (
        "I work as a nurse.",
        "I don't work as a nurse any more, I'm a paramedic now.",
        "paramedic",
        "nurse",
    ),
    ("我是老师。", "我以前是老师，现在是律师。", "律师", "老师"),
    # held out
    (
        "My address is 7 Birch Road, Oxford.",
        "We moved to 31 Harbour View, Bristol, a month ago.",
        "31 Harbour View, Bristol",
        "Birch",
    ),
    (
        "I live at 40 Quay Street, Dublin.",
        "I've just moved to 9 Mill Lane, Cork.",
        "9 Mill Lane",
        "Quay",
    ),
    (
        "My address is 5 Oak Road, Bath.",
        "My new address is 18 Cedar Close, Bath.",
        "18 Cedar Close",
        "Oak Road",
    ),
    (
        "我住在杭州市西湖区文三路12号。",
        "我上个月搬到了杭州市滨江区江南大道300号。",
        "江南大道300号",
        "文三路",
    ),
    (
        "I'm a vegetarian.",
        "I'm not a vegetarian anymore, I eat fish now.",
        "vegetarian anymore",
        '"vegetarian"',
    ),
    (
        "I am pescatarian.",
        "I stopped being pescatarian last year.",
        "stopped being pescatarian",
        '"pescatarian"',
    ),
    ("我吃素。", "我现在不吃素了。", "不吃素", '"吃素"'),
    ("I'm an accountant.", "I quit accounting, I now work as a baker.", "baker", "accountant"),
    ("I am a teacher.", "I used to be a teacher but now I'm a lawyer.", "lawyer", "teacher"),
    ("I work as a chef.", "I became a firefighter last spring.", "firefighter", "chef"),
    ("我是一名护士。", "我去年转行当了程序员。", "程序员", "护士"),
    ("我是会计。", "我现在是一名厨师。", "厨师", "会计"),
]


@pytest.mark.parametrize(("first", "correction", "new", "stale"), CORRECTIONS)
def test_a_correction_replaces_the_stale_value(
    first: str, correction: str, new: str, stale: str
) -> None:
    before = merge_profile(UserProfile(), _profile(first))
    assert stale.strip('"') in json.dumps(before.model_dump(), ensure_ascii=False), before
    after = merge_profile(before, _profile(correction))
    blob = json.dumps(after.model_dump(), ensure_ascii=False)
    assert new in blob and stale not in blob, after


def test_the_latest_occupation_in_one_batch_wins() -> None:
    """Fragments are inducted oldest first: a later statement is the user's latest word."""
    assert _profile("I work as a nurse.", "我是老师。").occupation == "老师"
    assert _profile("我是老师。", "I work as a nurse.").occupation == "nurse"


async def test_induct_takes_the_correction_over_sliced_turns() -> None:
    """Through the induct activity, as a user workflow runs it: two sessions of turns sliced by
    the offline slicer, the second correcting the first."""
    first = "User: I live at 40 Quay Street, Dublin.\nUser: I'm a vegetarian.\nUser: 我是会计。"
    second = (
        "User: I've just moved to 9 Mill Lane, Cork.\n"
        "User: I'm not a vegetarian anymore, I eat fish now.\nUser: 我现在是一名厨师。"
    )
    fragments = [
        Fragment(
            id=f"f{n}",
            user_id="u",
            theme="t",
            types=["fact"],
            content=text,
            created_at=n,
            reinforced_at=n,
        )
        for n, text in enumerate((first, second))
    ]

    class Store:
        async def get(self, user_id: str, ids: list[str]) -> list[Fragment]:
            return [f for f in fragments if f.id in ids]

    acts = LLMActivities(HeuristicMemoryModels(), Store())
    env = ActivityEnvironment()
    profile = UserProfile()
    for fid in ("f0", "f1"):
        out = await env.run(
            acts.induct, InductInput(user_id="u", profile=profile, fragment_ids=[fid])
        )
        profile = out.profile
    blob = json.dumps(profile.model_dump(), ensure_ascii=False)
    assert "9 Mill Lane" in blob and "Quay" not in blob, profile
    assert profile.occupation == "厨师", profile
    assert "vegetarian" not in profile.constraints and "Vegetarian" not in blob, profile
