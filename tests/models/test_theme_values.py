"""MnemoflowTheme carries a word of a fixed vocabulary, never words of the conversation.

Search attributes are stored in the clear (the payload codec never sees them) and forget does
not erase them (docs/PRIVACY.md), so the theme a round reports is reduced to THEME_VOCABULARY.
"""

from __future__ import annotations

import random
import string

import pytest

from mnemoflow.activities.llm.heuristic_rules import GENERAL, THEMES, theme_label
from mnemoflow.models import search_attributes as sa
from mnemoflow.models.search_attributes import THEME_VOCABULARY, theme_value
from mnemoflow.workflows.options import round_search_attributes


@pytest.mark.parametrize("theme", [*THEMES, GENERAL], ids=lambda t: t.key)
def test_every_heuristic_theme_keeps_its_own_name(theme) -> None:  # type: ignore[no-untyped-def]
    assert theme_value(theme.label_en) == theme.key
    assert theme_value(theme.label_zh) == theme.key


def test_the_general_label_loses_the_conversation_words_it_carries() -> None:
    text = "Featherstonehaugh mentioned the diagnosis; featherstonehaugh again. diagnosis."
    label = theme_label(GENERAL, text)
    assert "featherstonehaugh" in label  # what used to reach the search attribute
    assert theme_value(label) == "general"


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("Travel plans for Kyoto", "travel"),
        ("orders & payment", "orders"),
        ("Marguerite's oncology appointment", "other"),
        ("", "other"),
        ("旅行计划", "other"),
    ],
)
def test_model_made_labels_map_to_the_vocabulary(label: str, value: str) -> None:
    assert theme_value(label) == value


def test_no_label_ever_leaves_the_vocabulary() -> None:
    rng = random.Random(12)
    alphabet = string.ascii_letters + " :&,-" + "张伟旅行计划日常"
    for _ in range(5000):
        label = "".join(rng.choices(alphabet, k=rng.randint(0, 60)))
        assert theme_value(label) in THEME_VOCABULARY, label


def test_round_attributes_carry_the_vocabulary_word() -> None:
    attrs = round_search_attributes(theme="general: featherstonehaugh, diagnosis")
    assert attrs.get(sa.THEME) == "general"
