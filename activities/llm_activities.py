"""The LLM activities of a round: slice, tune and induct.

Each wraps one call of a `MemoryModels` (heuristic offline, or a LangChain chat model) and never
trusts its answer: drafts are validated and clamped, weights renormalised, profile updates merged
with bounded, de-duplicated lists. Failures leave as the ApplicationErrors described in
activities.llm.errors: malformed output is retried by Temporal up to `max_malformed_attempts`,
then fails for good; rate limits honour Retry-After; rejected requests fail at once. A slice the
model refuses for good keeps its turns verbatim instead, and such a tune the default weights
(`REFUSALS`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.heartbeat import heartbeating
from mnemoflow.activities.llm.base import (
    MemoryModels,
    validate_drafts,
    with_every_turn,
    within_bytes,
)
from mnemoflow.activities.llm.enrichment import with_notes
from mnemoflow.activities.llm.errors import INVALID_INPUT_TYPE, to_activity_error
from mnemoflow.memory.params import renormalise
from mnemoflow.memory.profile_merge import merge_profile
from mnemoflow.memory.text import content_tokens, normalise
from mnemoflow.models.contracts import (
    ActivityName,
    InductInput,
    InductOutput,
    SliceInput,
    SliceOutput,
    TuneInput,
    TuneOutput,
)
from mnemoflow.models.errors import InvalidInputError, MalformedModelOutputError
from mnemoflow.models.fragments import Fragment, theme_key
from mnemoflow.models.params import TunedParams
from mnemoflow.models.profile import UserProfile, profile_facts
from mnemoflow.models.round_store import (
    SLICE_AND_TUNE,
    SliceTuneInput,
    SliceTuneOutput,
    pack_params,
    tune_requests,
)

if TYPE_CHECKING:  # the store role builds it; the LLM role may run without
    from mnemoflow.activities.theme_weights import ThemeWeights

T = TypeVar("T")
log = logging.getLogger(__name__)
#: The error types of a model that refused its input for good, whatever the retry: a slice's
#: turns are kept verbatim and a tune's theme gets the default weights, rather than fail every
#: round that meets them again (an auth or quota rejection still fails).
REFUSALS = frozenset({INVALID_INPUT_TYPE, MalformedModelOutputError.type})


class FragmentReader(Protocol):
    """Where induct reads fragments from (activities.fragment_store.FragmentStore in production)."""

    async def get(self, user_id: str, ids: list[str]) -> list[Fragment]:
        """The user's fragments among `ids`, in the order asked; unknown ids are skipped."""
        ...


def _refusal(err: ApplicationError) -> str:
    return f"{err.type}: {str(err)[:300]}"


def _numbers(raw: dict[str, object]) -> dict[str, float]:
    """The numeric part of a raw answer, kept for the scoring log (junk is visible by absence)."""
    out: dict[str, float] = {}
    for key, value in raw.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            out[str(key)] = float(value)
    return out


class LLMActivities:
    """slice / tune / induct activities bound to one memory model and one fragment reader."""

    def __init__(
        self,
        models: MemoryModels,
        fragments: FragmentReader,
        *,
        max_malformed_attempts: int = 3,
        themes: ThemeWeights | None = None,
    ) -> None:
        if max_malformed_attempts < 1:
            raise ValueError("max_malformed_attempts must be at least 1")
        self.models = models
        self.fragments = fragments
        self.max_malformed_attempts = max_malformed_attempts
        self.themes = themes  # shape 5's stored weights (None: every lookup misses)

    async def _stored(self, user_id: str, keys: list[str]) -> dict[str, TunedParams]:
        if not user_id or self.themes is None:
            return {}
        return await self.themes.get(user_id, keys)

    async def _guarded(
        self, operation: str, call: Callable[[], Awaitable[T]], attempts_before: int = 0
    ) -> T:
        """Run one model call (heartbeating meanwhile), turning its failure into the right
        ApplicationError. `attempts_before` counts a round's failed local attempt, so a model
        that keeps answering malformed output is given up after `max_malformed_attempts` in all."""
        try:
            if activity.info().is_local:
                # A round's one local attempt (shape 3): bounded by its timeout, and a local
                # activity does not heartbeat to the server.
                return await call()
            async with heartbeating():
                return await call()
        except ApplicationError:
            raise
        except Exception as exc:
            mapped = to_activity_error(
                exc,
                operation=operation,
                model=self.models.name,
                attempt=activity.info().attempt + attempts_before,
                max_malformed_attempts=self.max_malformed_attempts,
            )
            if mapped is exc:
                raise  # transient: Temporal's retry policy handles it as it is
            raise mapped from exc

    @activity.defn(name=ActivityName.SLICE)
    async def slice(self, inp: SliceInput) -> SliceOutput:
        """Split one thread's turns into validated themed fragment drafts."""
        if not inp.turns:
            raise ApplicationError(
                f"slice for user {inp.user_id[:64]!r} got no turns",
                type=InvalidInputError.type,
                non_retryable=True,
            )
        if not any(turn.content.strip() for turn in inp.turns):
            # Nothing a model could remember (e.g. only tool-call stubs): no call, no cost.
            return SliceOutput(drafts=[], model=self.models.name)

        async def call() -> SliceOutput:
            sliced = await self.models.slice(inp.turns, inp.max_fragments)
            drafts = validate_drafts(sliced.drafts, len(inp.turns), inp.max_fragments)
            # Whatever the model left out or only paraphrased is kept verbatim as well.
            drafts = within_bytes(with_every_turn(drafts, inp.turns, inp.max_fragments))
            # Each line's date, resolved relative dates and the enrichment, to be indexed.
            drafts = with_notes(drafts, inp.turns)
            return SliceOutput(drafts=drafts, usage=sliced.usage, model=self.models.name)

        try:
            return await self._guarded("slice", call, inp.attempts_before)
        except ApplicationError as err:
            if err.type not in REFUSALS:
                raise
            # The model refused these turns for good (HTTP 400/413/422: a content filter, a
            # window too small; or output it never made valid): the same turns would be refused
            # at every later round, and everything said after them would wait behind them.
            # They are kept verbatim instead (docs/ARCHITECTURE.md, "The round").
            log.error(
                "slice refused for user %r, thread %r (%d turns), kept verbatim: %s",
                inp.user_id[:64],
                inp.turns[0].thread_id[:64],
                len(inp.turns),
                err,
            )
            return SliceOutput(
                drafts=with_notes(
                    within_bytes(with_every_turn([], inp.turns, inp.max_fragments)), inp.turns
                ),
                model=self.models.name,
                refused=_refusal(err),
            )

    @activity.defn(name=ActivityName.TUNE)
    async def tune(self, inp: TuneInput) -> TuneOutput:
        """Scoring weights for a theme: the model proposes, renormalise decides. With
        `lookup_user` (shape 5), the user's stored weights for the theme answer first."""
        stored = await self._stored(inp.lookup_user, [theme_key(inp.theme)])
        if stored:
            return TuneOutput(params=next(iter(stored.values())), cached=True)

        async def call() -> TuneOutput:
            tuned = await self.models.tune(inp.theme, inp.samples, inp.types)
            if not isinstance(tuned.params, dict):
                raise MalformedModelOutputError("tuned parameters are not an object")
            return TuneOutput(
                params=renormalise(tuned.params),
                raw=_numbers(tuned.params),
                usage=tuned.usage,
                model=self.models.name,
            )

        try:
            return await self._guarded("tune", call, inp.attempts_before)
        except ApplicationError as err:
            if err.type not in REFUSALS:
                raise
            # The samples are the theme's fragments: refused once, refused at every round that
            # meets the theme again, and the round would fail each time. The defaults serve.
            log.error("tune refused for theme %r, default weights used: %s", inp.theme[:60], err)
            return TuneOutput(params=renormalise({}), model=self.models.name, refused=_refusal(err))

    @activity.defn(name=SLICE_AND_TUNE)
    async def slice_and_tune(self, inp: SliceTuneInput) -> SliceTuneOutput:
        """A round's LLM step: slice, then tune the themes not cached; shape 3's one local
        attempt, and shape 6's one ordinary activity on an LLM queue of its own.

        A slice failure fails the step (locally, the round then slices as an ordinary
        activity; as an activity, Temporal retries it like the slice activity). After
        the slice succeeded the step never fails: a tune that fails or would run past
        `tune_budget_s` ends the tuning, and the round tunes what is left as ordinary
        activities, so the slice is never made twice.
        """
        began = time.monotonic()
        sliced = await self.slice(inp.slice)
        tuned = {}
        failed = False
        keys = [theme_key(d.theme) for d in sliced.drafts]
        looked = await self._stored(inp.lookup_user, keys)
        for key, request in tune_requests(sliced.drafts, {*inp.cached, *looked}):
            left = inp.tune_budget_s - (time.monotonic() - began)
            if left <= 0:
                failed = True
                break
            try:
                tuned[key] = await asyncio.wait_for(self.tune(request), timeout=left)
            except Exception:  # the round tunes it as an ordinary activity
                failed = True
                break
        return SliceTuneOutput(
            sliced=sliced,
            tuned=tuned,
            tune_failed=failed,
            looked_up={k: pack_params(p) for k, p in looked.items()},
        )

    @activity.defn(name=ActivityName.INDUCT)
    async def induct(self, inp: InductInput) -> InductOutput:
        """Fold fragments into the profile; returns the merged profile (not yet stored) and
        the ids actually inducted (ids no longer in the store are skipped)."""
        if inp.list_limit < 1:
            raise ApplicationError(
                f"induct: list_limit must be at least 1, got {inp.list_limit}",
                type=InvalidInputError.type,
                non_retryable=True,
            )
        if not inp.fragment_ids:
            return InductOutput(profile=inp.profile, inducted=[], model=self.models.name)
        # Store errors are transient: they propagate unchanged and Temporal retries them.
        fragments = await self.fragments.get(inp.user_id, list(inp.fragment_ids))
        if not fragments:
            return InductOutput(profile=inp.profile, inducted=[], model=self.models.name)

        async def call() -> InductOutput:
            inducted = await self.models.induct(inp.profile, fragments)
            merged = merge_profile(inp.profile, inducted.update, inp.list_limit)
            return InductOutput(
                profile=merged,
                inducted=[f.id for f in fragments],
                usage=inducted.usage,
                model=self.models.name,
                fact_sources=fact_sources(inp.profile, inducted.update, merged, fragments),
            )

        return await self._guarded("induct", call)


def fact_sources(
    before: UserProfile, update: UserProfile, merged: UserProfile, fragments: list[Fragment]
) -> dict[str, list[str]]:
    """Which of the inducted fragments state each fact this induction added or restated: the
    fact's words and numbers appear in the fragment's text (docs/ARCHITECTURE.md, "Forget leaves
    nothing to resurrect"). A fact no fragment holds in its own words (a model's paraphrase) gets
    [], so the user workflow credits the whole batch and forgets it with any of them."""
    old = profile_facts(before)
    restated = set(profile_facts(_tidy(update)))
    texts = [(f.id, _spaced(normalise(_SPEAKER.sub("", f.content)))) for f in fragments]
    tokens = {fid: content_tokens(text.strip()) for fid, text in texts}
    out: dict[str, list[str]] = {}
    for key, value in profile_facts(merged).items():
        if key in old and key not in restated:
            continue
        out[key] = [fid for fid, text in texts if _states(value, text, tokens[fid])]
    return out


def _tidy(update: UserProfile) -> UserProfile:
    """The update's values as merge_profile stores them (whitespace collapsed)."""
    values = update.model_dump()
    for field, value in values.items():
        if isinstance(value, str):
            values[field] = value.strip() or None
        elif isinstance(value, list):
            values[field] = [" ".join(v.split()) for v in value]
    return UserProfile.model_validate(values)


#: A fragment line's speaker label (`User (12:03): ...`, `Assistant: ...`): no fact's words.
_SPEAKER = re.compile(r"^(User|Assistant)(?: \([^)\n]*\))?:", re.MULTILINE)


def _spaced(norm: str) -> str:
    return f" {norm} "


def _states(value: str, text: str, tokens: set[str]) -> bool:
    """The fragment's text (normalised, space-padded) holds the value: as a phrase, or every
    content word and number of it (in any order, inflected: "busy on Wednesdays")."""
    norm = normalise(value)
    if not norm:
        return False
    if _spaced(norm) in text or (not norm.isascii() and norm in text):
        return True
    wanted = content_tokens(norm)
    return bool(wanted) and wanted <= tokens
