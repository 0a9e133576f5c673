"""Temporal contracts: one pydantic model in and one out for every workflow, activity, signal,
update and query. Contracts change only by adding fields with defaults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from mnemoflow.models.config import MemoryConfig, Vocation
from mnemoflow.models.fragments import Fragment, FragmentDraft, SelectionLog
from mnemoflow.models.params import TunedParams
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import CostLedger, LLMUsage, PriceTable

Trigger = Literal["handover", "budget", "ceiling", "explicit", "consolidate", "retry"]

# --- read model ------------------------------------------------------------------------------


class Watermark(BaseModel):
    """Per-thread counts of distinct messages: `accepted` by the user workflow, `indexed` in
    Milvus; every accepted message said before `pending_since` is indexed (None: all are)."""

    accepted: int = 0
    indexed: int = 0
    pending_since: float | None = None


class ContextFragment(BaseModel):
    """A selected fragment as the hot path needs it (enough to skip ones still in the window)."""

    id: str
    theme: str
    types: list[str]
    content: str
    thread_id: str = ""
    start_pos: int = 0
    end_pos: int = 0
    score: float = 0.0
    created_at: float = Field(0.0, description="when it was said (0: unknown), shown as a date")

    @classmethod
    def of(cls, fragment: Fragment, score: float = 0.0) -> ContextFragment:
        """The published form of a stored fragment, with the score that ranked it."""
        return cls(
            id=fragment.id,
            theme=fragment.theme,
            types=list(fragment.types),
            content=fragment.content,
            thread_id=fragment.thread_id,
            start_pos=fragment.start_pos,
            end_pos=fragment.end_pos,
            score=score,
            created_at=fragment.created_at,
        )


def stub_fragment(fid: str, score: float = 0.0) -> ContextFragment:
    """A published fragment held by id only (shape 4, docs/ARCHITECTURE.md, "The round"): the
    user workflow keeps the contents of the fragments its rounds made and names the others by
    id; the publish activity fills stubs from the stores before writing, and the workflow's
    `context` query leaves them out. A stored fragment's content is never empty."""
    return ContextFragment(id=fid, theme="", types=[], content="", score=score)


def is_stub(fragment: ContextFragment) -> bool:
    """Whether the fragment is a `stub_fragment` (its contents are in the stores only)."""
    return not fragment.content


def fill_stubs(
    fragments: list[ContextFragment],
    found: Mapping[str, ContextFragment],
    *,
    keep_unfound: bool,
) -> list[ContextFragment]:
    """`fragments` with each stub replaced by the content `found` for its id, at the stub's
    score; a stub with nothing found stays a stub (`keep_unfound`) or is left out."""
    return [
        found[f.id].model_copy(update={"score": f.score}) if is_stub(f) and f.id in found else f
        for f in fragments
        if keep_unfound or not is_stub(f) or f.id in found
    ]


class InjectedContext(BaseModel):
    """What the agent's next model call gets, prepared by the workflows and published to Redis."""

    user_id: str
    version: int = 0
    generated_at: float = 0.0
    profile: UserProfile = Field(default_factory=UserProfile)
    fragments: list[ContextFragment] = Field(default_factory=list)
    watermarks: dict[str, Watermark] = Field(default_factory=dict)
    top_k: int = 4
    forget_epoch: int = Field(
        0,
        description='the user\'s forget epoch (docs/ARCHITECTURE.md, "Forget epochs"): a publish '
        "of an older epoch than the user's record is refused; agents learn the epoch from it",
    )


def parse_published(raw: bytes | str | None) -> InjectedContext | None:
    """A read-model value as Redis returned it (key: `models.ids.context_key`): None when there
    is none, ValueError (a pydantic ValidationError) when it is unreadable. Both readers decode
    through here: the hot path (middleware/client.py) and ReadModel.get."""
    return None if raw is None else InjectedContext.model_validate_json(raw)


# --- user workflow ---------------------------------------------------------------------------


class SubmitEvent(BaseModel):
    """Signal: new messages of one thread (positions make a re-send a no-op)."""

    event_id: str = Field(min_length=1, max_length=512)
    turns: list[ChatTurn] = Field(default_factory=list)
    urgent: bool = Field(False, description="window reached the hard ceiling: slice now")
    trigger: Trigger = "handover"
    chat_usage: LLMUsage | None = Field(
        None, description="main chat model tokens the agent used since its last hand-over"
    )


class ResyncResult(BaseModel):
    """What `MemoryClient.resync` re-sent of a thread (the workflow keeps each message once)."""

    thread_id: str
    sent: int = Field(0, description="messages re-sent (those already accepted are no-ops)")
    skipped: int = Field(
        0,
        description="another user's messages, other middleware's summaries and messages of "
        "read-only turns",
    )
    unstamped: int = Field(
        0,
        description="of those sent, messages without a time stamp (copies from an app's own "
        "database): a user workflow that forgot its user refuses them, since when they were "
        "said is unknown (status: refused_after_forget); keep additional_kwargs to resync them",
    )


class ReinforceEvent(BaseModel):
    """Signal: the fragments a model call actually used (applied once per call id)."""

    call_id: str = Field(min_length=1, max_length=512)
    fragment_ids: list[str] = Field(default_factory=list)


class FragmentRef(BaseModel):
    """Enough of a fragment for the induction cursor: id, order and creation time."""

    id: str
    created_at: float
    seq: int = Field(description="monotonic per user; the induction cursor compares these")


class SweptRow(BaseModel):
    """What a forget needs of a failed round's row that a later round's sweep deletes
    (docs/ARCHITECTURE.md, "The round"): its lines, its span and speaker positions, the round
    that made it and the round that swept it (and stored its lines again under its own ids)."""

    id: str
    thread_id: str
    round_no: int = Field(description="the failed round that stored it")
    start_pos: int
    end_pos: int
    content: str
    swept_by: int = Field(0, description="the round whose sweep deletes it (0: none started yet)")


class ThreadState(BaseModel):
    """One thread's counts, the identities it accepted, and its accepted but not yet indexed
    turns (docs/ARCHITECTURE.md, "Message identity")."""

    accepted: int = Field(0, description="distinct messages accepted")
    indexed: int = Field(0, description="distinct messages indexed")
    pending: list[ChatTurn] = Field(default_factory=list)
    urgent: bool = False
    not_before: float = Field(0.0, description="after a failed round, wait until this time")
    last_seen: float = 0.0
    trigger: Trigger = Field("handover", description="strongest trigger since the last round")
    indexed_ahead: list[int] = Field(
        default_factory=list, description="unused since message identities (old state only)"
    )
    seen: dict[str, float] = Field(
        default_factory=dict,
        description="digest of each identity accepted -> when it was said, oldest accepted first",
    )
    horizon: float = Field(
        0.0, description="messages said at or before this time left `seen`: refused (0: none)"
    )
    failed_rounds: list[int] = Field(
        default_factory=list,
        description="numbers of this thread's rounds that failed after they started: rows they "
        "may have stored before failing are replaced by the round that re-slices their turns "
        "(RoundInput.sweep_rounds)",
    )
    failed_batches: dict[str, list[str]] = Field(
        default_factory=dict,
        description="failed round number -> digests of the turns it took (for failed_rounds "
        "only): a forget of one of its rows drops those turns by identity",
    )


class RoundRecord(BaseModel):
    """What the user workflow remembers of one round."""

    round_no: int
    workflow_id: str
    event_id: str
    thread_id: str
    start: int = Field(description="the thread's indexed count when the round started")
    end: int = Field(description="start + the round's messages")
    trigger: Trigger
    status: Literal["running", "completed", "failed"] = "running"
    fragments: int = 0
    error: str | None = None
    theme: str | None = Field(
        None,
        description="the round's first theme as a word of THEME_VOCABULARY, once it completed "
        "(rounds of shape 7 write no search attributes when they complete)",
    )
    started_at: float = 0.0
    finished_at: float | None = None


class UserMemoryState(BaseModel):
    """Everything the user workflow carries across continue-as-new."""

    threads: dict[str, ThreadState] = Field(default_factory=dict)
    seen_event_ids: list[str] = Field(default_factory=list)
    seen_call_ids: list[str] = Field(default_factory=list)
    pending_reinforce: list[ReinforceEvent] = Field(default_factory=list)
    rounds_started: int = 0
    rounds_completed: int = 0
    rounds_failed: int = 0
    fragment_seq: int = 0
    induction_cursor: int = Field(0, description="seq of the last inducted fragment")
    uninducted: list[FragmentRef] = Field(default_factory=list)
    inductions: int = 0
    induction_not_before: float = 0.0
    tuned: dict[str, TunedParams] = Field(default_factory=dict)
    profile: UserProfile = Field(default_factory=UserProfile)
    context: InjectedContext | None = None
    ledger: CostLedger = Field(default_factory=CostLedger)
    rounds: list[RoundRecord] = Field(default_factory=list)
    last_error: str | None = None
    continued: int = 0
    forget_receipts: list[ForgetReceipt] = Field(default_factory=list)
    fence: float = Field(
        0.0, description="the last forget's time: messages said at or before it are refused"
    )
    shred: list[str] = Field(
        default_factory=list,
        description="data key generations a forget retired; the run they are carried into "
        "destroys them first (its own history is sealed with a newer one: docs/PRIVACY.md)",
    )
    retired_threads: dict[str, float] = Field(
        default_factory=dict,
        description="digest of a pruned idle thread -> its horizon, so re-sends stay refused",
    )
    fenced_turns: list[str] = Field(
        default_factory=list,
        description="digests of human messages a forget refused (said before it) or dropped "
        "(pending when it came), bounded: a reply or tool result of their turn that arrives "
        "later is refused too (`ChatTurn.turn_of`)",
    )
    forgotten_quoting: list[str] = Field(
        default_factory=list,
        description="fragment ids forgotten (bounded), as soon as their rows are deleted: a "
        "reply that arrives later stamped as quoting one of them (`ChatTurn.quotes`) has those "
        "words cut out",
    )
    forgotten_lines: list[str] = Field(
        default_factory=list,
        description="digests of the lines of rows forgotten with their quotes (bounded, no "
        "words): a copy of one re-sent without a time stamp is refused",
    )
    refused_after_forget: int = Field(
        0,
        description="messages refused, or cut to nothing, because a forget covers them (besides "
        "those said before it)",
    )
    seen_archive: str = Field(
        "",
        description="identities that left their thread's `seen` (past MAX_SEEN_MESSAGES, or a "
        "pruned idle thread), oldest first: base64 of a fixed-width hash of (thread, identity) "
        "each (workflows/state_ops.py, `archived`), so a late message older than the horizon is "
        "refused only when it was seen",
    )
    profile_sources: dict[str, list[str]] = Field(
        default_factory=dict,
        description="profile fact key (models.profile.profile_facts) -> fragment ids it came from",
    )
    forgotten_fragments: list[str] = Field(
        default_factory=list, description="recently forgotten fragment ids (bounded)"
    )
    swept_rows: list[SweptRow] = Field(
        default_factory=list,
        description="rows of failed rounds read before a round's sweep deletes them, newest "
        "last (bounded: state_ops.MAX_SWEPT_ROWS, MAX_SWEPT_BYTES): a forget of one finds its "
        "lines here, in this run or a later one",
    )
    profile_stated: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "profile fact key -> the fragments among its sources whose text states it; a source "
            "not listed here was only credited because its batch could not be told apart"
        ),
    )
    induction_batch_limit: int = Field(
        0, description="fragments per induction after a batch failed for good (0: the default)"
    )
    induction_skipped: int = Field(
        0, description="fragments left out of the profile: their induction alone failed for good"
    )
    recent: list[ContextFragment] = Field(
        default_factory=list,
        description="the contents of the fragments made by rounds numbered `recent_from` or "
        "later, oldest round first (bounded: workflows/state_ops.py keep_made); a round does not "
        "send them back (RoundInput.held_from_round)",
    )
    recent_from: int = Field(
        0,
        description="every fragment a round numbered this or later stored is in `recent`, or "
        "was forgotten (0: no round is vouched for)",
    )
    context_floor: int = Field(
        0,
        description="the context version a fresh history found in Redis (an earlier history's "
        "or the same user's under another workflow id): its first context is numbered above it",
    )
    forget_epoch: int = Field(
        0,
        description='whole-user forgets made (docs/ARCHITECTURE.md, "Forget epochs"): every '
        "store write carries it, and a message stamped with an older one is refused",
    )
    refused_stale: int = Field(
        0, description="messages refused because they were stamped with an older forget epoch"
    )


class UserMemoryInput(BaseModel):
    """Input of UserMemoryWorkflow (state is set when continuing as new)."""

    user_id: str
    config: MemoryConfig = Field(default_factory=MemoryConfig)
    prices: PriceTable = Field(default_factory=PriceTable)
    llm_task_queue: str | None = Field(None, description="task queue of LLM activities")
    max_history_events: int = Field(
        10_000, ge=50, description="continue-as-new past this history length (tests force it low)"
    )
    search_attributes: bool = Field(True, description="set mnemoflow search attributes on rounds")
    search_user: str | None = Field(
        None, description="MnemoflowUser value (a keyed hash when pseudonymous); None = raw id"
    )
    pseudonymous: bool = Field(False, description="never show the raw user id to operators")
    state: UserMemoryState | None = None


class UserStatus(BaseModel):
    """Query: what the user workflow is doing."""

    user_id: str
    rounds_started: int
    rounds_completed: int
    rounds_failed: int
    pending_turns: int
    pending_events: int
    watermarks: dict[str, Watermark]
    induction_cursor: int
    uninducted: int
    inductions: int
    tuned_themes: list[str]
    ledger: CostLedger
    rounds: list[RoundRecord]
    last_error: str | None
    continued: int
    history_length: int = 0
    tuned: dict[str, TunedParams] = Field(default_factory=dict)
    config: MemoryConfig | None = Field(None, description="what the next round uses")
    undelivered: int = Field(
        0, description="messages this client holds that the workflow has not accepted yet"
    )
    forget_pending: bool = Field(
        False, description="a forget is under way (waiting for a store: see last_error)"
    )
    forget_epoch: int = Field(0, description="whole-user forgets made (UserMemoryState)")
    refused_stale: int = Field(
        0, description="messages refused: stamped with an epoch from before a forget"
    )
    refused_after_forget: int = Field(
        0,
        description="messages delivered after a forget that it covers, refused or cut to "
        "nothing (besides those said before it): added to a turn it refused, re-sent with no "
        "time stamp after it, or quoting what it forgot",
    )


# --- round workflow --------------------------------------------------------------------------


class RoundInput(BaseModel):
    """Input of MemoryRoundWorkflow: one thread's turns to slice, index, tune, select, publish."""

    user_id: str
    round_no: int
    event_id: str
    thread_id: str
    turns: list[ChatTurn]
    trigger: Trigger = "handover"
    first_seq: int = Field(description="seq given to the round's first fragment")
    config: MemoryConfig = Field(default_factory=MemoryConfig)
    tuned: dict[str, TunedParams] = Field(default_factory=dict)
    profile: UserProfile = Field(default_factory=UserProfile)
    watermarks_after: dict[str, Watermark] = Field(default_factory=dict)
    context_version: int = 0
    llm_task_queue: str | None = None
    search_attributes: bool = True
    shape: int = Field(
        1,
        description="1: classic (five activities); 2: lean (local store step, one upsert); "
        "3: lean with local LLM attempts and bounded payloads; 4: as 3, and the result carries "
        "the contents of the round's own fragments only (the others by reference); 5: as 4, "
        "without the theme cache (its LLM step looks the round's themes up in Redis); 6: as "
        "5, with an LLM queue of its own one LLM activity (slice, lookup, missing tunes); 7: "
        "as 6, and no search attributes written when it completes",
    )
    tuned_packed: dict[str, list[float]] = Field(
        default_factory=dict,
        description="shape 3: the theme cache as `tuned`, each entry's weights as a list in "
        "TunedParams' field order (a third of the bytes)",
    )
    tuned_compact: str = Field(
        "",
        description="shape 4: the theme cache as one base64 string (models.round_store."
        "pack_theme_cache: per theme, 4 bytes of its key's SHA-256 and its weights as half "
        "floats), about a quarter of `tuned_packed`'s bytes",
    )
    known_fragments: list[str] = Field(
        default_factory=list,
        description="shape 3: ids of the published fragments the user workflow holds (their "
        "contents do not come back in the result)",
    )
    held_from_round: int = Field(
        0,
        description="shape 4 and later: the user workflow holds the contents of every fragment "
        "made by a round numbered this or later (UserMemoryState.recent), so they do not come "
        "back in the result either (0: none held so)",
    )
    sweep_rounds: list[int] = Field(
        default_factory=list,
        description="rounds of this thread that failed after they started (ThreadState."
        "failed_rounds): the store step deletes the rows they stored before it compares the "
        "round's fragments with what is stored, so they are not skipped as repeats of rows no "
        "completed round owns",
    )
    epoch: int | None = Field(
        None,
        description="the user's forget epoch when the round started: its store writes carry it "
        "and are refused once a forget moved past it (None: rounds started before epochs)",
    )


class RankedRef(BaseModel):
    """A published fragment by id, with the score that ranked it (shape 3's slim result)."""

    id: str
    score: float = 0.0


class RoundResult(BaseModel):
    """Output of a round.

    Shape 3 returns the published selection as `ranked` (ids and scores, in order) and
    `context.fragments` holds only the contents the user workflow does not hold (ids not in the
    input's `known_fragments`), so the result's size does not grow with the context.
    """

    round_no: int
    fragments: list[FragmentRef] = Field(default_factory=list)
    themes: list[str] = Field(default_factory=list)
    tuned_new: dict[str, TunedParams] = Field(default_factory=dict)
    context: InjectedContext
    selection: SelectionLog | None = None
    usage: dict[str, LLMUsage] = Field(default_factory=dict)
    ranked: list[RankedRef] | None = Field(
        None, description="shape 3: the published fragments in order (contents: see above)"
    )
    by_reference: bool = Field(
        False,
        description="shape 4: `context.fragments` holds only the contents of the fragments this "
        "round made; the user workflow holds the others it lacks as `stub_fragment`s",
    )
    made: list[ContextFragment] | None = Field(
        None,
        description="the contents of the fragments this round stored that are not in "
        "`context.fragments` (unpublished ones), so that the user workflow holds every fragment "
        "the round made (UserMemoryState.recent); None from rounds before this field",
    )
    swept_rounds: list[int] = Field(
        default_factory=list,
        description="the input's `sweep_rounds` whose rows the store step deleted (empty from "
        "a store step before them: the user workflow keeps them for the next round)",
    )
    swept_rows: list[Fragment] = Field(
        default_factory=list,
        description="the rows those rounds had stored, as the sweep found them: a forget of one "
        "of them that came after the sweep takes its lines out of this round's rows",
    )


# --- activities ------------------------------------------------------------------------------


class SliceInput(BaseModel):
    """Turns of one thread to split into themed fragments."""

    user_id: str
    turns: list[ChatTurn]
    max_fragments: int = Field(16, ge=1)
    attempts_before: int = Field(
        0, ge=0, description="failed attempts made before this activity (a round's local one)"
    )


class SliceOutput(BaseModel):
    """Validated fragment drafts and the LLM usage; `refused` names the model's refusal when
    it refused these turns for good and they were kept verbatim instead (docs/ARCHITECTURE.md,
    "LLM failures")."""

    drafts: list[FragmentDraft]
    usage: LLMUsage = Field(default_factory=LLMUsage)
    model: str = ""
    refused: str = ""
    cached: bool = Field(False, description="shape 5: the stored weights, no model call")


class IndexInput(BaseModel):
    """Fragments to embed and upsert (ids are derived from business ids)."""

    fragments: list[Fragment]
    epoch: int | None = Field(
        None, description="the user's forget epoch: refused once a forget moved past it"
    )


class IndexOutput(BaseModel):
    """Ids upserted."""

    ids: list[str]


class TuneInput(BaseModel):
    """A theme and sample fragments to re-weight the scoring formula for."""

    theme: str
    samples: list[str] = Field(default_factory=list)
    types: list[str] = Field(default_factory=list)
    attempts_before: int = Field(
        0, ge=0, description="failed attempts made before this activity (a round's local one)"
    )
    lookup_user: str = Field(
        "", description="shape 5: answer with this user's stored weights when there are some"
    )


class TuneOutput(BaseModel):
    """Renormalised parameters (never trusted raw) and the LLM usage; `refused` names the
    model's refusal when it refused the theme's samples for good and the defaults were used."""

    params: TunedParams
    raw: dict[str, float] = Field(default_factory=dict)
    usage: LLMUsage = Field(default_factory=LLMUsage)
    model: str = ""
    refused: str = ""
    cached: bool = Field(False, description="shape 5: the stored weights, no model call")


class SelectInput(BaseModel):
    """Score the user's candidates for a query and pick the injected fragments."""

    user_id: str
    query: str
    theme: str = ""
    params: TunedParams = Field(default_factory=TunedParams)
    params_source: str = "default"
    config: MemoryConfig = Field(default_factory=MemoryConfig)
    now: float
    limit: int | None = Field(None, description="how many ranked fragments to return")


class SelectOutput(BaseModel):
    """Ranked fragments (picked first) and the scoring log of this selection."""

    fragments: list[ContextFragment]
    log: SelectionLog


class PublishInput(BaseModel):
    """The read model to write for a user.

    `contents_top`: the user workflow's own publishes ask for the contents of the stubs the
    publish filled among the first this many fragments (its `top_k`), so that what it holds
    whole is what a model call injects, also after a forget moved stubs up.
    """

    context: InjectedContext
    contents_top: int = Field(0, ge=0, le=64)


class PublishOutput(BaseModel):
    """Where it was written, how big it was, and the stubs filled among `contents_top`."""

    key: str
    bytes: int
    filled: list[ContextFragment] = Field(default_factory=list)


class InductInput(BaseModel):
    """Fold these fragments into the profile."""

    user_id: str
    profile: UserProfile
    fragment_ids: list[str]
    list_limit: int = 12


class InductOutput(BaseModel):
    """The merged profile (not yet stored) and the LLM usage."""

    profile: UserProfile
    inducted: list[str]
    usage: LLMUsage = Field(default_factory=LLMUsage)
    model: str = ""
    fact_sources: dict[str, list[str]] | None = Field(
        None,
        description=(
            "fact key (models.profile.profile_facts) of every fact this induction added or "
            "restated -> the inducted fragments whose text states it ([]: none could be told, "
            "e.g. a paraphrase); None: an inducer from before attribution"
        ),
    )


class ReinforceInput(BaseModel):
    """Strengthen the fragments one model call used."""

    user_id: str
    call_id: str
    fragment_ids: list[str]
    now: float
    epoch: int | None = Field(
        None, description="the user's forget epoch: refused once a forget moved past it"
    )


class ReinforceOutput(BaseModel):
    """How many of the user's fragments were strengthened."""

    updated: int


class ActivityName:
    """Registered activity names (workflows call activities by name: no heavy imports there)."""

    SLICE = "mnemoflow.slice"
    TUNE = "mnemoflow.tune"
    INDUCT = "mnemoflow.induct"
    INDEX = "mnemoflow.index"
    SELECT = "mnemoflow.select"
    REINFORCE = "mnemoflow.reinforce"
    PUBLISH = "mnemoflow.publish"
    DELETE_FRAGMENTS = "mnemoflow.delete_fragments"
    DELETE_READ_MODEL = "mnemoflow.delete_read_model"


class RememberRequest(BaseModel):
    """Update: remember this text explicitly (a high-importance fragment)."""

    event_id: str = Field(min_length=1, max_length=512)
    content: str = Field(min_length=1, max_length=8000)
    theme: str = Field("remembered", min_length=1, max_length=200)
    types: list[str] = Field(default_factory=lambda: ["fact"])


class RetryRoundRequest(BaseModel):
    """Update: re-run a failed round now (event id as listed in status.rounds)."""

    event_id: str = Field(min_length=1, max_length=600)


class RetryRoundResult(BaseModel):
    """Whether a retry was scheduled, and for how many pending turns."""

    scheduled: bool
    thread_id: str = ""
    pending_turns: int = 0
    reason: str = ""


class ConsolidateRequest(BaseModel):
    """Update: slice a thread's pending messages now (the session ended), not at maturity."""

    thread_id: str = Field(min_length=1, max_length=512)


class ConsolidateResult(BaseModel):
    """How many of the thread's messages were pending when the request was accepted."""

    thread_id: str
    pending_turns: int = 0


class ConfigUpdate(BaseModel):
    """Update: change the user's preset and/or parameters, applied from the next round."""

    vocation: Vocation | None = Field(None, description="a preset: its time constants and gates")
    params: dict[str, Any] = Field(default_factory=dict, description="MemoryConfig fields")


class ConfigUpdateResult(BaseModel):
    """The config the user's rounds use from now on."""

    config: MemoryConfig


class RememberResult(BaseModel):
    """The explicit fragment's id (derived from the event id, so a retry stores it once)."""

    fragment_id: str


class RecallRequest(BaseModel):
    """Update: score the user's fragments for a query."""

    query: str = Field(min_length=1, max_length=4000)
    top_k: int = Field(5, ge=1, le=50)


class RecallResult(BaseModel):
    """Scored fragments, best first, with the scoring log of this recall."""

    fragments: list[ContextFragment]
    log: SelectionLog | None = None


class ForgetFragmentRequest(BaseModel):
    """Update: delete one of the user's fragments."""

    fragment_id: str = Field(min_length=1, max_length=256)
    quotes: bool = Field(
        False,
        description="also cut its words out of the turns not stored yet and of the other "
        "conversation rows that quote them (what the forget_memory tool promises); without, "
        "only this fragment goes and what others say stays",
    )


class ForgetFragmentResult(BaseModel):
    """How many rows were deleted (0 when the id was not the user's), the profile facts that
    came only from that fragment and were removed, and whether the read model was republished.

    `pending` (set by MemoryClient, never by the workflow): the workflow accepted the forget
    (an UpdateAccepted event in its history) but had not finished it when the caller's deadline
    ended; it finishes it (a worker that dies is replaced), and `update_id` (of the run
    `run_id`) names it for `MemoryClient.forget_fragment_result`. `deleted` is then 0: not
    known yet."""

    deleted: int
    profile_facts_removed: int = 0
    republished: bool = False
    pending: bool = False
    update_id: str | None = None
    run_id: str | None = None


class ForgetRequest(BaseModel):
    """Update: forget the user entirely (right to be forgotten)."""

    reason: str = Field("user request", max_length=500)
    keys: bool = Field(
        True,
        description="retire and destroy the user's data keys; False when another workflow of "
        "the same user (the other id form) is forgotten next and destroys them",
    )


class ShredRequest(BaseModel):
    """Update: wait until the data keys the last forget retired are destroyed."""


class ForgetReceipt(BaseModel):
    """What was deleted, and when."""

    user_id: str
    at: float
    fragments_deleted: int
    read_model_deleted: int
    profile_cleared: bool
    events_dropped: int
    rounds_cancelled: int
    reason: str = ""
    keys_destroyed: int = Field(
        0, description="the user's data keys erased: Temporal's copies unreadable (PRIVACY.md)"
    )
    profile_facts_removed: int = Field(0, description="facts the profile held before the forget")
    histories: str = Field(
        "", description="what stays in Temporal: histories until the namespace's retention ends"
    )
    fence: float = Field(
        0.0,
        description="messages with no forget epoch said at or before this time are refused",
    )
    epoch: int = Field(
        0,
        description="the forget epoch from now on: messages stamped with an older one are "
        "refused, and so is every store write asked for before the forget",
    )
    keys_pending: int = Field(
        0,
        description="data keys retired by the forget and destroyed by the run it continued "
        "as; MemoryClient.forget waits for that (the `shredded` update)",
    )
    workflows_forgotten: int = Field(
        1,
        description="the user's memory workflows this forget reached: 2 when one under the "
        "other id form (readable or pseudonymous) ran too (MemoryClient.forget)",
    )


class ForgetLines(BaseModel):
    """The lines of a forgotten row (`content`) taken out of the rows one round stored again
    from the same turns: rows of `round_no` whose source positions overlap [start_pos,
    end_pos). A row left with no line is deleted; the others are stored again without those
    lines (same id, new vector)."""

    round_no: int | None = Field(description="the round whose rows (None: every round's)")
    start_pos: int
    end_pos: int
    content: str
    skip_ids: list[str] = Field(default_factory=list, description="rows being forgotten")
    check_ids: list[str] = Field(
        default_factory=list,
        description="rows the published context shows with these lines: the output's "
        "`checked` holds those still stored, as stored (a retry after a lost reply finds "
        "nothing left to do, yet the workflow learns what became of them)",
    )
    quotes: bool = Field(
        False,
        description="cut the row's words out wherever the round's rows quote them "
        "(`models.fragments.cut_quoted_lines`), whatever their span, instead of taking out "
        "lines equal to its lines",
    )


class DeleteFragmentsInput(BaseModel):
    """Activity: delete some (ids) or all (ids None) of a user's fragments.

    `read`: the output carries these rows as stored, read before anything is deleted (and
    `read_rounds`: those rows of these rounds).
    `forget_lines` also takes lines out of rows. Send both with `ids=[]`, never None: a worker
    from before the fields reads that as "delete nothing" rather than "delete all"."""

    user_id: str
    ids: list[str] | None = None
    read: list[str] = Field(default_factory=list)
    read_rounds: list[int] = Field(
        default_factory=list,
        description="the output also carries the user's conversation rows of these rounds",
    )
    forget_lines: ForgetLines | None = None
    epoch: int | None = Field(
        None,
        description="with ids None (the whole user): the forget epoch the user's record moves "
        "to before anything is deleted; with `forget_lines`: the epoch of its rewrites",
    )


class DeleteFragmentsOutput(BaseModel):
    """Rows deleted; the rows `read` named that exist; the rows `forget_lines` deleted (ids)
    and stored again without the lines (as now stored)."""

    deleted: int
    rows: list[Fragment] = Field(default_factory=list)
    deleted_ids: list[str] = Field(default_factory=list)
    rewritten: list[Fragment] = Field(default_factory=list)
    checked: list[Fragment] | None = Field(
        None, description="`forget_lines.check_ids` still stored (None: a worker from before)"
    )


class DeleteReadModelInput(BaseModel):
    """Activity: delete a user's read model."""

    user_id: str
    epoch: int | None = Field(
        None, description="the forget epoch the user's record is kept at least at (agents read it)"
    )


class DeleteReadModelOutput(BaseModel):
    """Keys deleted."""

    deleted: int


UserMemoryState.model_rebuild()
UserMemoryInput.model_rebuild()
