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
