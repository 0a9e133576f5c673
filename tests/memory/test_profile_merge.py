"""Profile merge: scalars and business fields, and list fields without paraphrase pile-ups."""

import pytest

from mnemoflow.memory.profile_merge import merge_list, merge_profile, normalise, text_similarity
from mnemoflow.models.profile import PROFILE_LIST_FIELDS, UserProfile


def test_normalise_folds_case_width_punctuation_and_spaces():
    assert normalise("  Busy on   Wednesdays. ") == "busy on wednesdays"
    assert normalise("ＢＵＳＹ，on Wednesdays!") == "busy on wednesdays"
    assert normalise("周三很忙。") == "周三很忙"
    assert normalise("?!") == ""


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("busy on Wednesdays", "Busy on Wednesdays."),
        ("busy on Wednesdays", "is busy every Wednesday"),
        ("plays tennis", "playing tennis"),
        ("Busy on Wednesday afternoons", "busy on Wednesdays"),  # containment
        ("周三很忙", "每周三都很忙"),
    ],
)
def test_paraphrases_are_similar(a, b):
    assert text_similarity(a, b) >= 0.8
    assert text_similarity(a, b) == text_similarity(b, a)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("busy on Wednesdays", "busy on Fridays"),
        ("plays tennis", "plays chess"),
        ("vegetarian", "vegan"),
        ("likes tea", "likes coffee"),
        ("tea", "steak"),  # no containment inside a word
        ("周三很忙", "周五很忙"),
        ("喜欢喝茶", "喜欢喝咖啡"),
    ],
)
def test_different_items_are_not_similar(a, b):
    assert text_similarity(a, b) < 0.8


def test_similarity_hand_values():
    # {busy, wednesday} vs {busy, friday}: 1 shared of min 2
    assert text_similarity("busy on Wednesdays", "busy on Fridays") == pytest.approx(0.5)
    # CJK unigrams + bigrams: 周三很忙 has 7 tokens, 6 of them in 每周三都很忙
    assert text_similarity("周三很忙", "每周三都很忙") == pytest.approx(6 / 7)
    assert text_similarity("", "") == 0.0
    assert text_similarity("the", "The!") == 1.0
    assert text_similarity("the", "an") == 0.0


def test_paraphrases_collapse_to_the_newest_wording():
    merged = merge_list(
        ["busy on Wednesdays", "vegetarian"],
        ["Busy on Wednesdays.", "is busy every Wednesday", "plays tennis"],
        limit=12,
    )
    assert merged == ["vegetarian", "is busy every Wednesday", "plays tennis"]


def test_a_later_correction_replaces_the_old_statement():
    merged = merge_list(["busy on Wednesdays"], ["no longer busy on Wednesdays"], limit=12)
    assert merged == ["no longer busy on Wednesdays"]


def test_merge_list_drops_blanks_and_collapses_whitespace():
    assert merge_list(["  a  b ", ""], ["...", "   "], limit=5) == ["a b"]


def test_merge_list_keeps_the_newest_within_the_limit():
    base = [f"hobby number {i}" for i in range(5)]
    update = ["collects stamps", "grows tomatoes"]
    merged = merge_list(base, update, limit=3)
    assert merged == ["hobby number 4", "collects stamps", "grows tomatoes"]


def test_merge_profile_scalars_update_wins_when_non_empty():
    base = UserProfile(name="Ana", occupation="nurse", style="formal")
    update = UserProfile(name="Ana Lima", occupation="  ", style=None)
    merged = merge_profile(base, update)
    assert (merged.name, merged.occupation, merged.style) == ("Ana Lima", "nurse", "formal")


def test_merge_profile_business_fields_update_wins_and_blank_never_erases():
    base = UserProfile(business_fields={"plan": "silver", "region": "EU"})
    update = UserProfile(business_fields={"plan": "gold", "region": " ", "account": "A-1"})
    merged = merge_profile(base, update)
    assert merged.business_fields == {"account": "A-1", "plan": "gold", "region": "EU"}


def test_merge_profile_dedups_every_list_field_and_bounds_it():
    base = UserProfile(**{field: ["busy on Wednesdays"] for field in PROFILE_LIST_FIELDS})
    paraphrases = ["Busy on Wednesdays.", "is busy every Wednesday"]
    update = UserProfile(**{field: paraphrases for field in PROFILE_LIST_FIELDS})
    merged = merge_profile(base, update, list_limit=12)
    for field in PROFILE_LIST_FIELDS:
        assert getattr(merged, field) == ["is busy every Wednesday"]


def test_repeated_merges_do_not_accumulate_paraphrases():
    profile = UserProfile()
    paraphrases = [
        "busy on Wednesdays",
        "Busy on Wednesdays.",
        "is busy every Wednesday",
        "BUSY ON WEDNESDAYS",
        "busy every Wednesday",
        "Is busy on Wednesdays",
        "busy wednesdays!",
    ]
    for text in paraphrases:
        profile = merge_profile(profile, UserProfile(constraints=[text, "allergic to peanuts"]))
    assert profile.constraints == ["busy wednesdays!", "allergic to peanuts"]


def test_merge_profile_leaves_its_inputs_alone_and_rejects_a_bad_limit():
    base = UserProfile(hobbies=["chess"])
    merge_profile(base, UserProfile(hobbies=["go"]))
    assert base.hobbies == ["chess"]
    with pytest.raises(ValueError):
        merge_profile(base, UserProfile(), list_limit=0)


# The user's own fact, then one about someone else in nearly the same words: two facts. The
# probe's four, then held-out ones in English and Chinese.
OTHER_PEOPLE = [
    ("Allergic to peanuts", "Husband Tom is allergic to peanuts"),
    ("Plays tennis", "Daughter Mia plays tennis"),
    ("Vegan", "Partner is not vegan"),
    ("女儿在北京上大学", "儿子在北京上大学"),
    ("Allergic to shellfish", "Wife Anna is allergic to shellfish"),
    ("Likes jazz", "My son likes jazz"),
    ("Vegetarian", "Girlfriend is not vegetarian"),
    ("Runs marathons", "Brother Sam runs marathons"),
    ("Lives in Leeds", "Mom lives in Leeds"),
    ("Works night shifts at the hospital", "Colleague Priya works night shifts at the hospital"),
    ("Plays chess on Sundays", "Plays chess on Sundays with grandpa"),
    ("Loves hiking", "Kate loves hiking"),
    (
        "Friend Sam Patel lives in Paris near the Louvre",
        "Friend Max Patel lives in Paris near the Louvre",
    ),
    (
        "Mother has type 2 diabetes, takes insulin daily",
        "Father has type 2 diabetes, takes insulin daily",
    ),
    ("喜欢游泳", "我女儿喜欢游泳"),
    ("在上海工作", "老公在上海工作"),
    ("对猫毛过敏", "我妈妈对猫毛过敏"),
    ("哥哥住在广州天河区", "姐姐住在广州天河区"),
    ("喜欢爬山", "小明喜欢爬山"),
    ("不吃辣", "我老婆不吃辣"),
    ("每天都去跑步", "我爸每天跑步"),
]
# Same words, another number: two facts (two appointments), and a negation that says more than
# "not": another fact, not a correction.
OTHER_FACTS = [
    (
        "Dentist appointment on 3 May at the clinic on King Street",
        "Dentist appointment on 17 May at the clinic on King Street",
    ),
    ("5月3日去医院复查", "5月17日去医院复查"),
    ("Drinks coffee", "Never drinks coffee after dinner"),
    ("Cooks dinner at home", "Never cooks dinner at home on weekdays"),
    ("喝咖啡", "晚上不喝咖啡"),
]
# What must still collapse to the newest wording: paraphrases of one fact about one person, and
# a correction that only negates it.
SAME_FACT = [
    ("Allergic to peanuts", "allergic to peanuts."),
    ("Prefers email", "Prefers email over phone"),
    ("Husband Tom is allergic to peanuts", "husband Tom is allergic to peanuts"),
    ("Daughter Mia plays tennis", "Daughter Mia plays tennis on Saturdays"),
    ("Dentist appointment on 3 May", "Dentist appointment on 3 May at the clinic"),
    ("对花生过敏", "我对花生过敏"),
    ("周三很忙", "每周三都很忙"),
    ("Vegan", "No longer vegan"),
    ("Likes jazz", "Doesn't like jazz any more"),
    ("吃素", "不吃素了"),
]


@pytest.mark.parametrize(("own", "other"), OTHER_PEOPLE + OTHER_FACTS)
def test_a_fact_about_someone_else_or_another_fact_keeps_both(own: str, other: str) -> None:
    """Similar words do not make one fact: someone else named, another number, or a negation
    with more to it leave the user's own item in the list, in either order."""
    assert merge_list([own], [other], limit=12) == [own, other]
    assert merge_list([other], [own], limit=12) == [other, own]
    merged = merge_profile(UserProfile(constraints=[own]), UserProfile(constraints=[other]))
    assert merged.constraints == [own, other]


@pytest.mark.parametrize(("old", "new"), SAME_FACT)
def test_one_fact_about_one_person_still_collapses(old: str, new: str) -> None:
    assert merge_list([old], [new], limit=12) == [new]
