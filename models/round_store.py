"""Contracts of the lean round's one store step (docs/ARCHITECTURE.md, "The round").

The lean round does its store work (index, select, publish) in one local activity,
`STORE_ROUND`: local activities leave one marker event in the round's history instead of an
activity's three events and a workflow task each. Its result is slim on purpose, because it is
recorded in the history: ids, counts and the picked fragments' terms, never the scoring log of
every candidate (which grew with the user's fragments) or the published context a second time.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from mnemoflow.models.contracts import ContextFragment, InjectedContext, RankedRef, SelectInput
from mnemoflow.models.fragments import Fragment, ScoredCandidate

#: The activity's registered name (workflows call activities by name).
STORE_ROUND = "mnemoflow.store_round"


class StoreRoundInput(BaseModel):
    """Index these fragments, select for the query, publish the context with the selection."""

    fragments: list[Fragment] = Field(default_factory=list)
    select: SelectInput
    context: InjectedContext = Field(description="the context to publish, without fragments")
    known: list[str] | None = Field(
        None,
        description="shape 3: fragment ids whose contents the round already holds; the output "
        "then carries only the others' contents (None: every published fragment's)",
    )


class StoreRoundOutput(BaseModel):
    """What the round needs to record: ids and counts, the published fragments, the picks."""

    indexed: list[str] = Field(default_factory=list, description="fragment ids upserted")
    fragments: list[ContextFragment] = Field(
        default_factory=list,
        description="the ranked fragments published (with `known`: only those not known)",
    )
    ranked: list[RankedRef] = Field(
        default_factory=list, description="every published fragment's id and score, in order"
    )
    candidates: int = Field(0, description="fragments scored")
    picked: list[ScoredCandidate] = Field(
        default_factory=list, description="scoring lines of the picked fragments only (shape 2)"
    )
    picked_terms: dict[str, list[float]] = Field(
        default_factory=dict,
        description="shape 3: the picked fragments' terms by id, [cos, R, T, F] rounded to 3 "
        "places (their scores are in `ranked`)",
    )
    published_bytes: int = 0


__all__ = ["STORE_ROUND", "StoreRoundInput", "StoreRoundOutput"]
