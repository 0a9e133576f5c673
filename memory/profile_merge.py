"""Merging a profile update into a profile without letting list fields fill with paraphrases.

The predecessor appended whatever the induction LLM returned, so one constraint accumulated 7-14
rewordings ("busy on Wednesdays", "Busy on Wednesdays.", "is busy every Wednesday", ...). Here list
items are de-duplicated exactly (after normalising case, width, punctuation and whitespace) and
semantically, with a deterministic text similarity that needs no model and works for English and
Chinese alike. On a near-duplicate the newest wording wins: a later statement may be a correction
("no longer busy on Wednesdays"), and the user's latest word is the one to trust.
"""

from __future__ import annotations

from mnemoflow.memory.text import content_tokens as _tokens
from mnemoflow.memory.text import normalise
from mnemoflow.models.profile import PROFILE_LIST_FIELDS, UserProfile

#: Single-valued profile fields (everything that is neither a list field nor business_fields).
PROFILE_SCALAR_FIELDS: tuple[str, ...] = tuple(
    name
    for name in UserProfile.model_fields
    if name not in PROFILE_LIST_FIELDS and name != "business_fields"
)


def text_similarity(a: str, b: str) -> float:
    """Similarity in [0, 1]: the overlap coefficient |A & B| / min(|A|, |B|) of content tokens.

    It is a fuzzy containment: 1.0 when one item's content is contained in the other's, and for
    paraphrases that only differ in function words or inflection. Symmetric and deterministic.
    """
    na, nb = normalise(a), normalise(b)
    if na == nb:
        return 1.0 if na else 0.0
    ta, tb = _tokens(na), _tokens(nb)
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / min(len(ta), len(tb))


def merge_list(
    base: list[str], update: list[str], limit: int, similarity_threshold: float = 0.8
) -> list[str]:
    """Base then update items (oldest to newest), near-duplicates collapsed to their newest
    wording, blanks dropped, bounded to the newest `limit`."""
    merged: list[str] = []
    for raw in [*base, *update]:
        item = " ".join(raw.split())
        if not normalise(item):
            continue
        merged = [m for m in merged if text_similarity(m, item) < similarity_threshold]
        merged.append(item)
    return merged[-limit:]


def merge_profile(
    base: UserProfile,
    update: UserProfile,
    list_limit: int = 12,
    similarity_threshold: float = 0.8,
) -> UserProfile:
    """The profile with the update folded in: non-empty update scalars and business fields win,
    list fields are merged by `merge_list`."""
    if list_limit < 1:
        raise ValueError(f"list_limit must be at least 1, got {list_limit}")
    values: dict[str, object] = {}
    for field in PROFILE_SCALAR_FIELDS:
        new = (getattr(update, field) or "").strip()
        values[field] = new or getattr(base, field)
    for field in PROFILE_LIST_FIELDS:
        values[field] = merge_list(
            getattr(base, field), getattr(update, field), list_limit, similarity_threshold
        )
    business = dict(base.business_fields)
    business.update({k: v for k, v in update.business_fields.items() if v.strip()})
    values["business_fields"] = dict(sorted(business.items()))
    return UserProfile.model_validate(values)
