"""The structured long-term picture of a user, built incrementally from fragments."""

from __future__ import annotations

from pydantic import BaseModel, Field

PROFILE_LIST_FIELDS: tuple[str, ...] = (
    "hobbies",
    "interests",
    "expertise",
    "goals",
    "constraints",
    "values",
    "relationships",
)


class UserProfile(BaseModel):
    """A user's profile. List fields are de-duplicated and bounded when merged."""

    name: str | None = None
    occupation: str | None = None
    style: str | None = None
    hobbies: list[str] = Field(default_factory=list)
    interests: list[str] = Field(default_factory=list)
    expertise: list[str] = Field(default_factory=list)
    goals: list[str] = Field(default_factory=list)
    constraints: list[str] = Field(default_factory=list)
    values: list[str] = Field(default_factory=list)
    relationships: list[str] = Field(default_factory=list)
    business_fields: dict[str, str] = Field(default_factory=dict)

    def is_empty(self) -> bool:
        """True when nothing is known yet."""
        return self == UserProfile()


def profile_facts(profile: UserProfile) -> dict[str, str]:
    """Every fact of a profile under a stable key (field, or field + value for lists and
    business fields), so facts can carry provenance: the fragments they were inducted from."""
    facts: dict[str, str] = {}
    for field in ("name", "occupation", "style"):
        value = getattr(profile, field)
        if value:
            facts[f"{field}\x1f{value}"] = value
    for field in PROFILE_LIST_FIELDS:
        for value in getattr(profile, field):
            facts[f"{field}\x1f{value}"] = value
    for key, value in profile.business_fields.items():
        facts[f"business_fields\x1f{key}\x1f{value}"] = value
    return facts


def without_facts(profile: UserProfile, keys: set[str]) -> UserProfile:
    """The profile with the facts under `keys` (from `profile_facts`) removed."""
    update: dict[str, object] = {}
    for field in ("name", "occupation", "style"):
        if f"{field}\x1f{getattr(profile, field)}" in keys:
            update[field] = None
    for field in PROFILE_LIST_FIELDS:
        values = getattr(profile, field)
        kept = [v for v in values if f"{field}\x1f{v}" not in keys]
        if len(kept) != len(values):
            update[field] = kept
    business = {
        k: v
        for k, v in profile.business_fields.items()
        if f"business_fields\x1f{k}\x1f{v}" not in keys
    }
    if len(business) != len(profile.business_fields):
        update["business_fields"] = business
    return profile.model_copy(update=update) if update else profile
