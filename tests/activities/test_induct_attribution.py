"""The induct activity says which fragments state each fact it added or restated."""

from __future__ import annotations

from mnemoflow.activities.llm_activities import fact_sources
from mnemoflow.memory.profile_merge import merge_profile
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile


def _fragment(fid: str, content: str) -> Fragment:
    return Fragment(
        id=fid, user_id="u", theme="t", types=["fact"], content=content, created_at=0.0,
        reinforced_at=0.0,
    )  # fmt: skip


def test_each_fact_is_credited_to_the_fragments_that_state_it() -> None:
    fragments = [
        _fragment("f1", "User: My name is Ada Byron.\nAssistant: Hello Ada."),
        _fragment("f2", "User: My order number is 7734. I am busy on Wednesdays."),
        _fragment("f3", "User: 我的生日是1990年3月5日。Again, I'm Ada Byron."),
        _fragment("f4", "User: I start work at nine."),
    ]
    before = UserProfile(hobbies=["chess"], goals=["learn Welsh"])
    update = UserProfile(
        name="Ada Byron",
        constraints=["busy every Wednesday", "art classes"],
        hobbies=["chess", "sailing"],
        relationships=["assistant user"],  # the speaker labels are no words of the user's
        goals=["learn  Welsh"],  # restated (spacing as a model may return it)
        business_fields={"order number": "7734", "生日": "1990年3月5日"},
    )
    merged = merge_profile(before, update)
    assert fact_sources(before, update, merged, fragments) == {
        "name\x1fAda Byron": ["f1", "f3"],
        "goals\x1flearn Welsh": [],  # restated, but no fragment here says it
        "constraints\x1fbusy every Wednesday": ["f2"],  # its content words, inflected
        "constraints\x1fart classes": [],  # "art" inside "start" is not the word
        "hobbies\x1fchess": [],  # restated, said by none of them
        "hobbies\x1fsailing": [],  # new, said by none of them (a model's invention or paraphrase)
        "relationships\x1fassistant user": [],
        "business_fields\x1forder number\x1f7734": ["f2"],
        "business_fields\x1f生日\x1f1990年3月5日": ["f3"],
    }
