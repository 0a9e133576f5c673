"""Fragments (themed slices of a conversation) and what selection says about them."""

from __future__ import annotations

from pydantic import BaseModel, Field

MAX_THEME_KEY_CHARS = 200


def theme_key(theme: str) -> str:
    """What makes two themes the same: an LLM writes "Travel " and "travel" for one theme.

    The one definition for the tuned-parameter cache (keyed by it in workflow state) and the
    selection's per-theme cap: case-folded, whitespace collapsed, bounded.
    """
    return " ".join(theme.split()).casefold()[:MAX_THEME_KEY_CHARS]


class FragmentDraft(BaseModel):
    """What a slicer proposes: a theme, types, the content, and the turns it came from."""

    theme: str = Field(min_length=1, max_length=200)
    types: list[str] = Field(min_length=1)
    content: str = Field(min_length=1)
    start_idx: int = Field(ge=0, description="first turn index within the sliced batch")
    end_idx: int = Field(ge=0, description="last turn index within the sliced batch (inclusive)")


class Fragment(BaseModel):
    """A stored fragment, as kept in Milvus (without its vector)."""

    id: str
    user_id: str
    theme: str
    types: list[str]
    content: str
    created_at: float
    reinforced_at: float
    strengthen_count: int = 0
    round_no: int = 0
    thread_id: str = ""
    start_pos: int = 0
    end_pos: int = 0
    explicit: bool = False


class Candidate(BaseModel):
    """A fragment with its cosine similarity to the query, the input of selection."""

    fragment: Fragment
    cos: float


class ScoredCandidate(BaseModel):
    """One candidate's line in the scoring log: every term, weighted, and whether it was picked."""

    fragment_id: str
    theme: str
    types: list[str]
    cos: float
    R: float
    T: float
    F: float
    alpha_R: float
    beta_T: float
    gamma_F: float
    delta: float
    score: float
    picked: bool
    reason: str = ""


class SelectionLog(BaseModel):
    """One selection: when, with which parameters, and every candidate's terms."""

    at: float
    theme: str
    params_source: str
    candidates: list[ScoredCandidate] = Field(default_factory=list)
