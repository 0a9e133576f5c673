"""Custom search attributes of mnemoflow, as typed keys.

Pure definitions (only `temporalio.common`), so workflows can import them inside the sandbox.
They let the Temporal UI answer "which rounds of user X failed, and why": rounds carry the
user, their number, what triggered them, the main theme and the outcome.
Registration on a server lives in `mnemoflow.worker.search_attributes`.
"""

from __future__ import annotations

import re

from temporalio.common import SearchAttributeKey

#: The user id (pseudonymised when the worker is configured so).
USER = SearchAttributeKey.for_keyword("MnemoflowUser")
#: The round number within the user's memory.
ROUND = SearchAttributeKey.for_int("MnemoflowRound")
#: What made the round due: handover, budget, ceiling, explicit, retry.
TRIGGER = SearchAttributeKey.for_keyword("MnemoflowTrigger")
#: The first theme a round produced (the one an operator most likely searches for), as a word
#: of THEME_VOCABULARY (`theme_value`).
THEME = SearchAttributeKey.for_keyword("MnemoflowTheme")
#: How the round ended: completed, failed, ...
OUTCOME = SearchAttributeKey.for_keyword("MnemoflowOutcome")

#: Every custom key, in a stable order (registration and docs iterate over this).
ALL_KEYS: tuple[SearchAttributeKey, ...] = (USER, ROUND, TRIGGER, THEME, OUTCOME)

#: Every value MnemoflowTheme takes. Search attributes are stored in the clear (the payload
#: codec never sees them) and are not erased by forget, so a theme is reduced to one of these
#: words: never words of the conversation (docs/PRIVACY.md).
THEME_VOCABULARY: tuple[str, ...] = (
    "identity",
    "relationships",
    "preferences",
    "orders",
    "devices",
    "address",
    "schedule",
    "goals",
    "pets",
    "work",
    "health",
    "travel",
    "finance",
    "general",
    "other",
)
#: Words (English, Chinese) of theme labels that name a vocabulary entry; the first one found
#: in a theme's label wins. The heuristic models' labels all map to their key.
_THEME_WORDS: dict[str, str] = {
    **{word: word for word in THEME_VOCABULARY},
    "contact": "identity",
    "name": "identity",
    "profile": "identity",
    "family": "relationships",
    "relationship": "relationships",
    "friends": "relationships",
    "preference": "preferences",
    "likes": "preferences",
    "food": "preferences",
    "hobbies": "preferences",
    "order": "orders",
    "payment": "orders",
    "payments": "orders",
    "shopping": "orders",
    "shipping": "orders",
    "delivery": "orders",
    "device": "devices",
    "schedules": "schedule",
    "availability": "schedule",
    "calendar": "schedule",
    "plans": "goals",
    "goal": "goals",
    "learning": "goals",
    "pet": "pets",
    "job": "work",
    "career": "work",
    "medical": "health",
    "trip": "travel",
    "money": "finance",
    "banking": "finance",
    "chat": "general",
    "身份与联系方式": "identity",
    "家人与关系": "relationships",
    "偏好": "preferences",
    "订单与支付": "orders",
    "设备": "devices",
    "地址": "address",
    "时间安排": "schedule",
    "目标与计划": "goals",
    "宠物": "pets",
    "日常": "general",
}
_LABEL_WORD = re.compile(r"[^\W\d_]+")


def theme_value(theme: str) -> str:
    """The MnemoflowTheme value of a theme label: a word of THEME_VOCABULARY, never the label.

    Only the label's head counts (the heuristic "general: <frequent words>" is "general"); a
    theme that names no known word is "other".
    """
    head = theme.split(":", 1)[0].casefold()
    for word in _LABEL_WORD.findall(head):
        if word in _THEME_WORDS:
            return _THEME_WORDS[word]
    return "other"
