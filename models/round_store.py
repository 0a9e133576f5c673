"""Contracts of the lean round's local steps (docs/ARCHITECTURE.md, "The round").

The lean round does its store work (index, select, publish) in one local activity,
`STORE_ROUND`: local activities leave one marker event in the round's history instead of an
activity's three events and a workflow task each. Its result is slim on purpose, because it is
recorded in the history: ids, counts and the picked fragments' terms, never the scoring log of
every candidate (which grew with the user's fragments) or the published context a second time.

Shape 3 also makes its LLM calls as one local attempt, `SLICE_AND_TUNE`: slice, then tune the
themes not cached (`tune_requests`, the same rule the workflow applies when it tunes them as
ordinary activities), one marker for both.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from functools import lru_cache
from typing import Protocol

from pydantic import BaseModel, Field

from mnemoflow.models.contracts import (
    ContextFragment,
    InjectedContext,
    RankedRef,
    SelectInput,
    SliceInput,
    SliceOutput,
    TuneInput,
    TuneOutput,
)
from mnemoflow.models.fragments import Fragment, ScoredCandidate, theme_key
from mnemoflow.models.ids import fragment_id
from mnemoflow.models.params import TunedParams

#: The activity's registered name (workflows call activities by name).
STORE_ROUND = "mnemoflow.store_round"
#: Shape 3's LLM step as one local attempt: slice, then tune the themes not cached.
SLICE_AND_TUNE = "mnemoflow.slice_and_tune"
#: What a fresh history of a user finds already stored (UserMemoryWorkflow, at its start).
STORED_FLOOR = "mnemoflow.stored_floor"
#: A round tunes at most this many themes (its last ones), from this many characters of each.
MAX_TUNES_PER_ROUND = 4
TUNE_SAMPLE_CHARS = 1500
#: Themes whose weights a user keeps: the user workflow's cache and shape 5's Redis hash.
MAX_TUNED_THEMES = 64


class Themed(Protocol):
    """A draft or a fragment: what tuning reads of it."""

    @property
    def theme(self) -> str: ...
    @property
    def content(self) -> str: ...
    @property
    def types(self) -> list[str]: ...


#: A fragment id in shape 3's `ranked` and `known_fragments` without the user's part, which
#: every one of the user's fragment ids starts with (models.ids.fragment_id): `~r12-f0`.
SHORT_ID_MARK = "~"


@lru_cache(maxsize=1024)
def _id_head(user_id: str) -> str:
    return f"{fragment_id(user_id, 0, 0).rsplit('-r0-f0', 1)[0]}-"


def short_id(user_id: str, fid: str) -> str:
    """The id without the user's part (ids of another form stay whole)."""
    head = _id_head(user_id)
    return SHORT_ID_MARK + fid[len(head) :] if fid.startswith(head) else fid


def full_id(user_id: str, sid: str) -> str:
    """The whole id of a `short_id`."""
    return _id_head(user_id) + sid[1:] if sid.startswith(SHORT_ID_MARK) else sid


_ROUND_PART = re.compile(r"r([0-9]{1,9})-f[0-9]{1,9}")


def round_of(user_id: str, fid: str) -> int | None:
    """The number of the round that made this fragment of the user (`models.ids.fragment_id`),
    or None for an id of another form (an explicitly remembered fragment, another user's)."""
    head = _id_head(user_id)
    if not fid.startswith(head):
        return None
    found = _ROUND_PART.fullmatch(fid, len(head))
    return int(found.group(1)) if found else None


def held_by_round(user_id: str, fid: str, held_from_round: int) -> bool:
    """Whether the user workflow holds this fragment's contents because a round numbered
    `held_from_round` or later made it (RoundInput.held_from_round; 0: none held so)."""
    if held_from_round <= 0:
        return False
    made_in = round_of(user_id, fid)
    return made_in is not None and made_in >= held_from_round


def pack_params(params: TunedParams, places: int = 6) -> list[float]:
    """The weights as a list in TunedParams' field order, rounded (RoundInput.tuned_packed)."""
    return [round(v, places) for v in params.model_dump().values()]


def unpack_params(values: list[float]) -> TunedParams:
    """The weights of a `pack_params` list."""
    return TunedParams(**dict(zip(TunedParams.model_fields, values, strict=True)))


#: Bytes of a theme key's SHA-256 in `theme_ref`: two of a user's 64 themes share them with a
#: chance of about 1e-13 (4 bytes: 5e-7, i.e. about one user in two million).
THEME_DIGEST_BYTES = 7


def theme_ref(key: str) -> str:
    """A theme key's stand-in in shape 4's theme cache: a space (which no theme key starts
    with, `theme_key` strips it) and the first THEME_DIGEST_BYTES of the key's SHA-256, in
    hex."""
    return " " + hashlib.sha256(key.encode("utf-8")).digest()[:THEME_DIGEST_BYTES].hex()


#: Per theme in `pack_theme_cache`: the digest of `theme_ref`, then the weights in
#: TunedParams' field order as IEEE half-precision floats (about 3 significant digits).
_THEME_ENTRY = struct.Struct(f"<{THEME_DIGEST_BYTES}s" + "e" * len(TunedParams.model_fields))


def pack_theme_cache(tuned: dict[str, TunedParams]) -> str:
    """The theme cache as one base64 string (RoundInput.tuned_compact): 21 bytes a theme, so
    what a round's input carries stays small with up to MAX_TUNED_THEMES themes. Themes whose
    references collide are left out, both: each is tuned again rather than scored with the
    other's weights."""
    refs = Counter(theme_ref(key) for key in tuned)
    raw = b"".join(
        _THEME_ENTRY.pack(bytes.fromhex(ref[1:]), *params.model_dump().values())
        for key, params in tuned.items()
        if refs[ref := theme_ref(key)] == 1
    )
    return base64.b64encode(raw).decode("ascii")


def unpack_theme_cache(packed: str) -> dict[str, TunedParams]:
    """The cache of `pack_theme_cache`, keyed by `theme_ref` (see `cached_params`)."""
    raw = base64.b64decode(packed)
    out: dict[str, TunedParams] = {}
    for digest, *weights in _THEME_ENTRY.iter_unpack(raw):
        out[" " + digest.hex()] = TunedParams(
            **dict(zip(TunedParams.model_fields, weights, strict=True))
        )
    return out


def cached_params(tuned: Mapping[str, TunedParams], key: str) -> TunedParams | None:
    """A theme's cached weights, whether the cache is keyed by theme keys or by `theme_ref`."""
    return tuned.get(key) or tuned.get(theme_ref(key))


def ordered_themes(items: Sequence[Themed]) -> list[str]:
    """The distinct themes by theme key, in the order of their last occurrence."""
    seen: dict[str, str] = {}
    for item in items:
        seen.pop(theme_key(item.theme), None)
        seen[theme_key(item.theme)] = item.theme
    return list(seen.values())


def tune_requests(items: Sequence[Themed], cached: Collection[str]) -> list[tuple[str, TuneInput]]:
    """The tune calls a round makes: its last MAX_TUNES_PER_ROUND themes whose key (or its
    `theme_ref`) is not cached, each with bounded samples of its content and its types (one
    rule for the workflow and the local slice-and-tune step)."""
    out: list[tuple[str, TuneInput]] = []
    for theme in ordered_themes(items)[-MAX_TUNES_PER_ROUND:]:
        key = theme_key(theme)
        if key in cached or theme_ref(key) in cached or any(k == key for k, _ in out):
            continue
        same = [i for i in items if theme_key(i.theme) == key]
        samples = bounded_texts([i.content for i in same], TUNE_SAMPLE_CHARS)
        types = sorted({t for i in same for t in i.types})
        out.append((key, TuneInput(theme=theme, samples=samples, types=types)))
    return out


def bounded_texts(texts: list[str], limit: int) -> list[str]:
    """The texts in order, cut so that together they hold at most `limit` characters."""
    out: list[str] = []
    used = 0
    for text in texts:
        if used >= limit:
            break
        out.append(text[: limit - used])
        used += len(out[-1])
    return out


class SliceTuneInput(BaseModel):
    """Slice these turns, then tune the themes whose keys are not in `cached`."""

    slice: SliceInput
    cached: list[str] = Field(default_factory=list, description="theme keys already tuned")
    lookup_user: str = Field(
        "",
        description="shape 5: the user whose stored weights (activities/theme_weights.py) "
        "the step looks up for its themes before tuning them",
    )
    tune_budget_s: float = Field(
        description="no tune call starts or runs past this many seconds after the step began: "
        "the step returns the slice before its own bound, so a success is never lost"
    )


class SliceTuneOutput(BaseModel):
    """The slice, the tunes that were made, and whether one failed or ran out of time (the
    round tunes what is left as ordinary activities)."""

    sliced: SliceOutput
    tuned: dict[str, TuneOutput] = Field(default_factory=dict, description="by theme key")
    tune_failed: bool = False
    looked_up: dict[str, list[float]] = Field(
        default_factory=dict,
        description="shape 5: the stored weights of the slice's themes (`pack_params`), by key",
    )


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
    new_weights: dict[str, list[float]] = Field(
        default_factory=dict,
        description="shape 5: the weights the round tuned (`pack_params`, by theme key), "
        "stored for later rounds (activities/theme_weights.py)",
    )
    contents_top: int | None = Field(
        None,
        description="shape 4: contents only among the first this many ranked fragments (and "
        "only of those not `known`); the user workflow names the others by id",
    )
    known_from_round: int = Field(
        0,
        description="the round already holds the contents of every fragment made by a round "
        "numbered this or later (RoundInput.held_from_round; 0: none)",
    )
    sweep_rounds: list[int] = Field(
        default_factory=list,
        description="failed rounds of the user whose stored rows are deleted first "
        "(RoundInput.sweep_rounds)",
    )
    epoch: int | None = Field(
        None,
        description="the user's forget epoch when the round started (RoundInput.epoch): the "
        "store refuses the write once a forget moved the user's record past it (None: no check)",
    )


class StoreRoundOutput(BaseModel):
    """What the round needs to record: ids and counts, the published fragments, the picks."""

    indexed: list[str] = Field(default_factory=list, description="fragment ids upserted")
    fragments: list[ContextFragment] = Field(
        default_factory=list,
        description="the ranked fragments published (with `known`: only those not known)",
    )
    ranked: list[RankedRef] = Field(
        default_factory=list,
        description="every published fragment's short id (`short_id`) and score, in order",
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
    swept_rounds: list[int] = Field(
        default_factory=list, description="the input's `sweep_rounds`, once their rows are gone"
    )
    swept: int = Field(0, description="rows of those rounds deleted")
    swept_rows: list[Fragment] = Field(
        default_factory=list,
        description="the rows the sweep deleted, as they were stored: a forget_fragment of one "
        "of them that comes after the sweep takes its lines out of this round's rows",
    )


class StoredFloorInput(BaseModel):
    """Whose stores to read."""

    user_id: str


class StoredFloorOutput(BaseModel):
    """What a user workflow starting a fresh history must number above: the highest round
    number among the user's stored fragments (an earlier history's, or the same user under a
    new workflow id), and the version of the context Redis holds."""

    round_no: int = 0
    context_version: int = 0
    forget_epoch: int = Field(
        0, description="the user's forget epoch record (activities/store_epochs.py), 0: none"
    )


__all__ = [
    "MAX_TUNES_PER_ROUND",
    "SLICE_AND_TUNE",
    "STORED_FLOOR",
    "STORE_ROUND",
    "THEME_DIGEST_BYTES",
    "TUNE_SAMPLE_CHARS",
    "SliceTuneInput",
    "SliceTuneOutput",
    "StoreRoundInput",
    "StoreRoundOutput",
    "StoredFloorInput",
    "StoredFloorOutput",
    "cached_params",
    "full_id",
    "held_by_round",
    "ordered_themes",
    "pack_params",
    "pack_theme_cache",
    "round_of",
    "short_id",
    "theme_ref",
    "tune_requests",
    "unpack_params",
    "unpack_theme_cache",
]
