"""Pure transitions of UserMemoryState: what the user workflow's loop does to its state.

Kept apart from the workflow class so every rule (de-duplication, deadlines, cursor moves) is a
plain function that unit tests can call without a Temporal server. Deterministic: `now` is passed
in (the workflow gives `workflow.now()`), nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Collection

from mnemoflow.memory.text import normalise
from mnemoflow.memory.triggers import induction_due_at, slice_due_at
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    ContextFragment,
    ForgetReceipt,
    FragmentRef,
    InductOutput,
    InjectedContext,
    ReinforceEvent,
    RoundRecord,
    RoundResult,
    SubmitEvent,
    SweptRow,
    ThreadState,
    Trigger,
    UserMemoryState,
    Watermark,
    fill_stubs,
    is_stub,
)
from mnemoflow.models.fragments import (
    Fragment,
    SpokenLine,
    cut_quotes,
    piece_at,
    quoted_texts,
    spoken_lines,
)
from mnemoflow.models.profile import UserProfile, profile_facts, without_facts
from mnemoflow.models.round_store import MAX_TUNED_THEMES, round_of
from mnemoflow.models.search_attributes import theme_value
from mnemoflow.models.turns import ChatTurn, identity_digest, turn_identity
from mnemoflow.models.usage import PriceTable

MAX_SEEN_EVENTS = 4096
MAX_SEEN_CALLS = 4096
MAX_PENDING_REINFORCE = 1000
MAX_ROUND_RECORDS = 50
MAX_PUBLISHED_THREADS = 50
MAX_IDLE_THREADS = 200
MAX_FORGET_RECEIPTS = 20
MAX_SEEN_MESSAGES = 4096
#: Identities that left `seen` are archived (`UserMemoryState.seen_archive`), this many per user
#: at most, ARCHIVE_KEY_BYTES each (a hash of thread and identity: 64 bits, so a new message
#: matching any of 32,768 archived ones by chance is about 2e-15): 350 KB of base64 at the
#: bound. Past it the oldest go, and a re-send of one of those is stored again (a duplicate):
#: the archive errs only on the side of storing, never refuses what it did not see.
MAX_ARCHIVED_MESSAGES = 32_768
ARCHIVE_KEY_BYTES = 8
MAX_FACT_SOURCES = 32
MAX_FORGOTTEN_FRAGMENTS = 512
#: Human messages a forget refused or dropped, whose turn's later messages it refuses too.
MAX_FENCED_TURNS = 1024
#: Failed rounds of one thread whose rows its next round deletes (older ones stay stored).
MAX_FAILED_ROUNDS = 32
#: Rows of failed rounds kept, read before a sweep deletes them (UserMemoryState.swept_rows):
#: at most this many, newest kept, and this many bytes of contents (they travel in the
#: continue-as-new input).
MAX_SWEPT_ROWS = 64
MAX_SWEPT_BYTES = 128_000
MAX_RETIRED_THREADS = 1000
#: The contents of the fragments the latest rounds made that the user workflow keeps
#: (`recent`, docs/ARCHITECTURE.md "The round"): at most this many fragments and this many
#: bytes of content (UTF-8), the oldest rounds' going first. A fragment that comes back into
#: the first `top_k` while it is kept does not travel again in the round's history.
RECENT_MAX_FRAGMENTS = 256
RECENT_MAX_BYTES = 64_000


def _remember(seen: list[str], key: str, limit: int) -> bool:
    """Add key to a bounded, ordered seen-list; False when it was already there."""
    if key in seen:
        return False
    seen.append(key)
    del seen[:-limit]
    return True


def absorb_submit(
    s: UserMemoryState,
    event: SubmitEvent,
    cfg: MemoryConfig,
    now: float,
    horizon_at_now: bool = False,
    archive_rule: Callable[[], bool] | None = None,
    late_rule: Callable[[], bool] | None = None,
    epoch_rule: bool = False,
) -> None:
    """Accept an event's turns once: by event id, then each message by its identity within its
    thread (docs/ARCHITECTURE.md, "Message identity"). A turn is refused when its identity was
    accepted before, or when it was said at or before the last forget (`fence`) or the thread's
    horizon (identities old enough to have left the bounded `seen` memory).

    `horizon_at_now` (workflows/user_memory.py, HORIZON_AT_NOW_PATCH): a horizon that moves past
    forgotten identities, or that a pruned thread keeps, never passes `now`. A message stamped
    ahead of the workflow's clock (a caller's clock running ahead) would otherwise set a horizon
    in the future, and every later line of its thread would be refused until that time.

    `epoch_rule` (workflows/user_forget.py, FORGET_EPOCH): a turn stamped with a forget epoch is
    refused when the epoch is older than the user's, and never by its time: the fence then
    needs no clock agreement between the agent and the worker (docs/ARCHITECTURE.md, "Forget
    epochs"). A turn without an epoch (never stamped by a middleware that knows epochs) is
    judged by the time fence as before.

    `archive_rule` (workflows/user_memory.py, SEEN_ARCHIVE_PATCH; asked only where its answer
    changes what is accepted): identities that left `seen` are kept in `seen_archive`, and a
    message not in `seen` is refused when it is archived, never for its time alone: a late line
    a second writer said before the horizon is stored (docs/ARCHITECTURE.md, "Message
    identity"). Without it (histories from before), a line at or before the horizon is refused.

    `late_rule` (FORGET_COVERS_LATE_TURNS_PATCH, asked only where it changes what is kept):
    what a forget covers is refused, or cut, however late it is delivered
    (`covered_by_forget`)."""
    if not _remember(s.seen_event_ids, event.event_id, MAX_SEEN_EVENTS):
        return
    if event.chat_usage is not None:  # the agent's chat tokens, counted once per event id
        s.ledger.chat = s.ledger.chat + event.chat_usage
    touched: set[str] = set()
    archive = _ArchiveCheck(s, archive_rule)
    for turn in sorted(event.turns, key=lambda t: (t.thread_id, t.time, t.position)):
        if epoch_rule and turn.epoch is not None:
            if turn.epoch < s.forget_epoch:  # said before the latest forget
                s.refused_stale += 1
                fenced(s, [turn])
                continue
            if s.forget_epoch == 0 and turn.time <= s.fence:
                fenced(s, [turn])
                continue  # the user's only forgets were made before epochs: fenced by time
        elif turn.time <= s.fence:
            fenced(s, [turn])
            continue
        ts = thread_state(s, turn.thread_id)
        if horizon_at_now and ts.horizon > MAX_SECONDS_HORIZON:
            ts.horizon = horizon_in_seconds(ts.horizon)
        digest = identity_digest(turn_identity(turn))
        if digest in ts.seen or archive.refuses(turn.thread_id, digest, turn.time <= ts.horizon):
            continue
        kept = covered_by_forget(s, turn, late_rule)
        if kept is None:
            s.refused_after_forget += 1
            continue
        turn = kept
        if len(turn.content) > cfg.max_turn_chars:
            turn = turn.model_copy(update={"content": turn.content[: cfg.max_turn_chars]})
        ts.pending.append(turn)
        ts.seen[digest] = turn.time
        ts.accepted += 1
        ts.last_seen = now
        touched.add(turn.thread_id)
    trigger = "ceiling" if event.urgent else event.trigger
    for thread_id in {t.thread_id for t in event.turns}:
        known = s.threads.get(thread_id)
        if known is None:
            continue
        known.urgent = known.urgent or (event.urgent and bool(known.pending))
        known.trigger = stronger_trigger(known.trigger, trigger)
    if touched and horizon_at_now:
        for thread_id in touched:  # identities stamped in ms-read-as-s sort as they are read now
            seen = s.threads[thread_id].seen
            for digest, at in seen.items():
                if at > MAX_SECONDS_HORIZON:
                    seen[digest] = horizon_in_seconds(at)
    if touched:
        _bound_seen(s, now, horizon_at_now)
    _prune_idle_threads(s, now, horizon_at_now)


#: A horizon past this (the start of year 5000 in seconds) was set from stamps in milliseconds
#: that were read as seconds before the middleware scaled them (JavaScript's `Date.now()`): it
#: refused every line said after the upgrade, now read in seconds (probe: 0 of 10 stored).
MAX_SECONDS_HORIZON = 95_617_584_000.0


def horizon_in_seconds(horizon: float) -> float:
    """The horizon in seconds, as its messages are now read (a thousandth until plausible)."""
    while horizon > MAX_SECONDS_HORIZON:
        horizon /= 1000
    return horizon


def stamped_ahead(s: UserMemoryState, events: list[SubmitEvent], now: float) -> bool:
    """Whether a turn of `events` or an identity a thread remembers is stamped after `now`, or a
    thread's horizon (live or retired) is past it: only then can `horizon_at_now` change what
    `absorb_submit` does."""
    return (
        any(t.time > now for e in events for t in e.turns)
        or any(
            ts.horizon > now or any(v > now for v in ts.seen.values()) for ts in s.threads.values()
        )
        or any(h > now for h in s.retired_threads.values())
    )


def was_forgotten(s: UserMemoryState) -> bool:
    """Whether the user was ever forgotten whole (a fence is set, a receipt kept)."""
    return s.fence > 0 or bool(s.forget_receipts)


def fenced(s: UserMemoryState, turns: Collection[ChatTurn]) -> None:
    """Remember the human messages a forget refused or dropped: the rest of their turn (a
    reply made after the forget, in a turn that began before it) follows them out."""
    for turn in turns:
        if turn.role == "human":
            _remember(s.fenced_turns, identity_digest(turn_identity(turn)), MAX_FENCED_TURNS)


def forgotten_with_quotes(s: UserMemoryState, fragment_id: str) -> None:
    """A fragment forgotten (deleted): a reply delivered later that the middleware stamped as
    quoting it (`ChatTurn.quotes`: words it took from the injected fragment) loses those words
    (`covered_by_forget`)."""
    _remember(s.forgotten_quoting, fragment_id, MAX_FORGOTTEN_FRAGMENTS)


def line_digest(text: str) -> str:
    """What the state keeps of a forgotten line to know a copy of it (no words)."""
    return identity_digest("line\x1f" + " ".join(text.split()))


def forgotten_lines(s: UserMemoryState, texts: Collection[str]) -> None:
    """The lines of a row forgotten with its quotes (`models.fragments.quoted_texts`): a copy
    of one re-sent later without a time stamp (`ChatTurn.unstamped`) is refused."""
    for text in texts:
        _remember(s.forgotten_lines, line_digest(text), MAX_FENCED_TURNS)


def replies_quoting(s: UserMemoryState, fragment_id: str) -> bool:
    """Whether a pending turn is stamped as quoting the fragment (`ChatTurn.quotes`)."""
    return any(fragment_id in t.quotes for ts in s.threads.values() for t in ts.pending)


def cut_replies_quoting(s: UserMemoryState, fragment_id: str) -> int:
    """Cut the words pending replies took from a forgotten fragment (`ChatTurn.quotes`) out of
    them, as `covered_by_forget` does on arrival, and out of their stamps; a reply left with
    nothing leaves (it stays an accepted identity, out of the counts). Returns how many turns
    changed."""
    changed = 0
    for thread_id, ts in s.threads.items():
        parts: list[tuple[ChatTurn, str | None]] = []
        for turn in ts.pending:
            texts = turn.quotes.get(fragment_id)
            rest = cut_quotes(turn.content, texts) if texts else turn.content
            if rest != turn.content:
                parts.append((turn, rest if any(c.isalnum() for c in rest) else None))
        if parts:
            s.refused_after_forget += sum(left is None for _, left in parts)
            changed += forget_turns(s, thread_id, parts)
        # The forgotten words leave the stamps too: they would travel on in rounds and state.
        ts.pending = [
            t.model_copy(update={"quotes": {k: v for k, v in t.quotes.items() if k != fragment_id}})
            if fragment_id in t.quotes
            else t
            for t in ts.pending
        ]
    return changed


def covered_by_forget(
    s: UserMemoryState, turn: ChatTurn, rule: Callable[[], bool] | None
) -> ChatTurn | None:
    """The turn as it may be kept, or None when a forget covers it whole
    (docs/ARCHITECTURE.md, "Invariants": forget), however late it arrives:
    - re-sent without a time stamp (`unstamped`) after the user was forgotten, or a copy of a
      line of a row forgotten with its quotes: when it was said is unknown, and a copy of what
      was forgotten must not come back;
    - added to a turn whose human message a forget refused or dropped (`turn_of`): a reply
      made after a whole-user forget, in a turn that began before it;
    - quoting a fragment forgotten with its quotes (`quotes`): those words are cut out, and a
      turn left with nothing is refused.
    `rule` (the workflow's patch) is asked only when the answer changes what is kept; without
    one, or when it says no (histories from before), the turn is kept as it came."""
    out: ChatTurn | None = turn
    unknown_time = turn.unstamped and (
        was_forgotten(s)
        or (bool(s.forgotten_lines) and line_digest(turn.content) in s.forgotten_lines)
    )
    if unknown_time or (turn.turn_of and identity_digest(turn.turn_of) in s.fenced_turns):
        out = None
    elif turn.quotes and s.forgotten_quoting:
        gone = set(s.forgotten_quoting)
        texts = [q for fid, qs in turn.quotes.items() if fid in gone for q in qs]
        rest = cut_quotes(turn.content, texts) if texts else turn.content
        if rest != turn.content:
            left = any(c.isalnum() for c in rest)
            out = turn.model_copy(update={"content": rest, "quotes": {}}) if left else None
    if out is turn or rule is None or not rule():
        return turn
    return out


def archive_key(thread_id: str, digest: str) -> bytes:
    """What `seen_archive` keeps of one identity of a thread (`identity_digest`)."""
    raw = f"{thread_id}\x1f{digest}".encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).digest()[:ARCHIVE_KEY_BYTES]


def _archived_in(raw: bytes, key: bytes) -> bool:
    """Whether `key` is one of the fixed-width entries of `raw` (aligned, not a straddle)."""
    at = raw.find(key)
    while at >= 0:
        if at % ARCHIVE_KEY_BYTES == 0:
            return True
        at = raw.find(key, at + 1)
    return False


def archived(s: UserMemoryState, thread_id: str, digest: str) -> bool:
    """Whether the identity (its `identity_digest`) left the thread's `seen` into the archive."""
    return bool(s.seen_archive) and _archived_in(
        base64.b64decode(s.seen_archive), archive_key(thread_id, digest)
    )


def archive_seen(s: UserMemoryState, thread_id: str, digests: Collection[str]) -> None:
    """Keep identities that leave a thread's `seen` (bounded: the oldest go first)."""
    if not digests:
        return
    raw = base64.b64decode(s.seen_archive) + b"".join(archive_key(thread_id, d) for d in digests)
    s.seen_archive = base64.b64encode(raw[-MAX_ARCHIVED_MESSAGES * ARCHIVE_KEY_BYTES :]).decode()


class _ArchiveCheck:
    """`absorb_submit`'s look-ups in the archive: decoded once per event, and the workflow's
    patch asked only where the new rule and the old one disagree."""

    def __init__(self, s: UserMemoryState, rule: Callable[[], bool] | None) -> None:
        self._s = s
        self._rule = rule
        self._raw: bytes | None = None

    def refuses(self, thread_id: str, digest: str, past_horizon: bool) -> bool:
        """Whether a message not in its thread's `seen` is refused: archived (new rule), or at
        or before the horizon (the rule of histories recorded before the archive)."""
        if self._rule is None or (not past_horizon and not self._s.seen_archive):
            return past_horizon
        if self._raw is None:
            self._raw = base64.b64decode(self._s.seen_archive)
        seen = _archived_in(self._raw, archive_key(thread_id, digest))
        if seen == past_horizon:
            return seen
        return seen if self._rule() else past_horizon


def thread_state(s: UserMemoryState, thread_id: str) -> ThreadState:
    """The thread's state, created on first use (a pruned thread comes back with its horizon)."""
    ts = s.threads.get(thread_id)
    if ts is None:
        horizon = s.retired_threads.pop(identity_digest(thread_id), 0.0)
        ts = s.threads[thread_id] = ThreadState(horizon=horizon)
    return ts


def _bound_seen(s: UserMemoryState, now: float, at_now: bool) -> None:
    """Keep at most MAX_SEEN_MESSAGES identities per user: the thread remembering the most
    forgets its oldest accepted ones that are not pending, and its horizon moves past them;
    they are archived (`archive_seen`), so a re-send of one is still recognised.

    `at_now`: the horizon never passes `now`, and identities stamped ahead of `now` are
    forgotten last (before the archive, a re-send of one forgotten was accepted again: a
    possible duplicate of a message with a wrong clock, where a future horizon lost every later
    line)."""
    total = sum(len(t.seen) for t in s.threads.values())
    while total > MAX_SEEN_MESSAGES:
        thread_id, ts = max(s.threads.items(), key=lambda kv: len(kv[1].seen))
        pending = {identity_digest(turn_identity(t)) for t in ts.pending}
        kept = [d for d in ts.seen if d not in pending]
        if at_now:
            kept.sort(key=lambda d: ts.seen[d] > now)  # stable: oldest first within each
        drop = kept[: max(1, total - MAX_SEEN_MESSAGES)]
        if not drop:
            return  # everything remembered is pending: nothing may be forgotten yet
        for digest in drop:
            stamp = ts.seen.pop(digest)
            ts.horizon = max(ts.horizon, min(stamp, now) if at_now else stamp)
        archive_seen(s, thread_id, drop)
        total -= len(drop)


_TRIGGER_RANK = {
    "handover": 0,
    "budget": 1,
    "explicit": 2,
    "consolidate": 3,
    "ceiling": 4,
    "retry": 5,
}


def stronger_trigger(a: Trigger, b: Trigger) -> Trigger:
    """The trigger an operator should see for a round that several events made due."""
    return a if _TRIGGER_RANK[a] >= _TRIGGER_RANK[b] else b


def schedule_retry(s: UserMemoryState, thread_id: str) -> int:
    """Make a thread's pending turns due now, as a retry; returns how many are pending."""
    ts = s.threads.get(thread_id)
    if ts is None or not ts.pending:
        return 0
    ts.not_before = 0.0
    ts.urgent = True
    ts.trigger = "retry"
    return len(ts.pending)


def schedule_consolidation(s: UserMemoryState, thread_id: str) -> int:
    """Make a thread's pending turns due now (the session ended: do not wait for maturity).

    Unlike a retry it does not lift a failed round's back-off. Returns how many are pending.
    """
    ts = s.threads.get(thread_id)
    if ts is None or not ts.pending:
        return 0
    ts.urgent = True
    ts.trigger = stronger_trigger(ts.trigger, "consolidate")
    return len(ts.pending)


def absorb_remembered(s: UserMemoryState, ref: FragmentRef) -> None:
    """An explicitly remembered fragment joins the induction queue with the next seq."""
    s.fragment_seq += 1
    s.uninducted.append(ref.model_copy(update={"seq": s.fragment_seq}))


def drop_uninducted(s: UserMemoryState, ids: set[str]) -> None:
    """Deleted fragments never reach the profile."""
    s.uninducted = [r for r in s.uninducted if r.id not in ids]


def _prune_idle_threads(s: UserMemoryState, now: float, at_now: bool) -> None:
    """Forget the watermarks of long-idle threads with nothing pending (bounded state); a pruned
    thread keeps a horizon: its newest accepted stamp, never past `now` with `at_now` (a stamp
    ahead of the workflow's clock would refuse every later line of the thread)."""
    if len(s.threads) <= MAX_IDLE_THREADS:
        return
    idle = sorted((t.last_seen, k) for k, t in s.threads.items() if not t.pending)
    for _, key in idle[: len(s.threads) - MAX_IDLE_THREADS]:
        ts = s.threads.pop(key)
        archive_seen(s, key, list(ts.seen))
        horizon = max(ts.horizon, *ts.seen.values(), 0.0)
        s.retired_threads[identity_digest(key)] = min(horizon, now) if at_now else horizon
    for old in list(s.retired_threads)[:-MAX_RETIRED_THREADS]:
        del s.retired_threads[old]


def absorb_reinforce(s: UserMemoryState, event: ReinforceEvent) -> None:
    """Queue a reinforcement once per call id."""
    if not event.fragment_ids:
        return
    if _remember(s.seen_call_ids, event.call_id, MAX_SEEN_CALLS):
        s.pending_reinforce.append(event)
        del s.pending_reinforce[:-MAX_PENDING_REINFORCE]


def round_batch(ts: ThreadState, max_turns: int) -> list[ChatTurn]:
    """The next round's turns: the oldest pending messages by when they were said (a message
    that arrives late, from another writer or a re-send, joins the next round)."""
    ordered = sorted(enumerate(ts.pending), key=lambda it: (it[1].time, it[0]))
    return [turn for _, turn in ordered[: max(1, max_turns)]]


def pending_since(ts: ThreadState) -> float | None:
    """When the oldest message still waiting for its round was said (None: none waits)."""
    return min((t.time for t in ts.pending), default=None)


def thread_due_at(ts: ThreadState, cfg: MemoryConfig, now: float) -> float | None:
    """When a thread's round is due: oldest pending message mature, or now when urgent."""
    if not ts.pending:
        return None
    due = now if ts.urgent else slice_due_at(min(t.time for t in ts.pending), cfg)
    return max(due, ts.not_before)


def due_thread(
    s: UserMemoryState, cfg: MemoryConfig, now: float, held: Collection[str] = ()
) -> str | None:
    """The thread whose round is due first (ties by thread id), if any is due now; `held`
    threads wait (a forget is taking turns out of their pending list)."""
    best: tuple[float, str] | None = None
    for thread_id, ts in s.threads.items():
        if thread_id in held:
            continue
        due = thread_due_at(ts, cfg, now)
        if due is not None and due <= now and (best is None or (due, thread_id) < best):
            best = (due, thread_id)
    return best[1] if best else None


def mature_for_induction(s: UserMemoryState, cfg: MemoryConfig, now: float) -> list[FragmentRef]:
    """Un-inducted fragments that reached the long-term gate, in cursor order."""
    if now < s.induction_not_before:
        return []
    ready = [r for r in s.uninducted if induction_due_at(r.created_at, cfg) <= now]
    return sorted(ready, key=lambda r: r.seq)


def next_due(s: UserMemoryState, cfg: MemoryConfig, held: Collection[str] = ()) -> float | None:
    """The earliest future deadline (a round or an induction), for the durable timer; `held`
    threads have none (their forget wakes the loop when it lets go of them)."""
    dues: list[float] = []
    for thread_id, ts in s.threads.items():
        if ts.pending and thread_id not in held:
            due = thread_due_at(ts, cfg, ts.last_seen)
            if due is not None:
                dues.append(due)
    if s.uninducted:
        oldest = min(r.created_at for r in s.uninducted)
        dues.append(max(induction_due_at(oldest, cfg), s.induction_not_before))
    return min(dues) if dues else None


def round_started(s: UserMemoryState, record: RoundRecord) -> None:
    """Keep a bounded list of recent rounds."""
    s.rounds.append(record)
    del s.rounds[:-MAX_ROUND_RECORDS]


def round_completed(
    s: UserMemoryState,
    record: RoundRecord,
    result: RoundResult,
    batch: list[ChatTurn],
    now: float,
    prices: PriceTable,
) -> None:
    """Advance the indexed watermark and hand the new fragments to the induction queue."""
    ts = s.threads[record.thread_id]
    done = {turn_identity(t) for t in batch}
    before = len(ts.pending)
    ts.pending = [t for t in ts.pending if turn_identity(t) not in done]
    ts.indexed += before - len(ts.pending)
    ts.urgent = ts.urgent and bool(ts.pending)
    ts.trigger = ts.trigger if ts.pending else "handover"
    ts.not_before = 0.0
    s.uninducted.extend(result.fragments)
    if result.fragments:
        s.fragment_seq = max(s.fragment_seq, max(r.seq for r in result.fragments))
    for key, params in result.tuned_new.items():
        s.tuned.pop(key, None)
        s.tuned[key] = params
    for key in list(s.tuned)[:-MAX_TUNED_THEMES]:
        del s.tuned[key]
    s.context = result.context
    for operation, usage in result.usage.items():
        s.ledger.add(operation, usage, prices)
    s.rounds_completed += 1
    if result.swept_rounds:
        swept = set(result.swept_rounds)
        ts.failed_rounds = [n for n in ts.failed_rounds if n not in swept]
        _keep_failed_batches(ts)
    theme = theme_value(result.themes[0]) if result.themes else None
    _finish(record, "completed", now, fragments=len(result.fragments), theme=theme)


def keep_made(
    s: UserMemoryState, user_id: str, round_no: int, result: RoundResult, skip: set[str]
) -> None:
    """Keep the contents of every fragment the completed round stored (`recent`), so later
    rounds need not send them back while they are kept. A round from before `made` (None) could
    not say what it stored: nothing is vouched for until the next one. `skip`: forgotten ids."""
    if result.made is None:
        drop_recent(s)
        return
    stored = {r.id for r in result.fragments} - skip
    if s.recent_from == 0:
        s.recent_from = round_no
    have = {f.id for f in s.recent}
    for f in [*result.context.fragments, *result.made]:
        if f.id in stored and f.id not in have and not is_stub(f):
            have.add(f.id)
            s.recent.append(f.model_copy(update={"score": 0.0}))
    _bound_recent(s, user_id)


def _bound_recent(s: UserMemoryState, user_id: str) -> None:
    """Drop the oldest rounds' contents past the bounds; the rounds vouched for start after."""
    size = sum(_content_bytes(f) for f in s.recent)
    while s.recent and (len(s.recent) > RECENT_MAX_FRAGMENTS or size > RECENT_MAX_BYTES):
        oldest = round_of(user_id, s.recent[0].id) or 0
        s.recent_from = max(s.recent_from, oldest + 1)
        kept = [f for f in s.recent if (round_of(user_id, f.id) or 0) >= s.recent_from]
        size -= sum(_content_bytes(f) for f in s.recent) - sum(_content_bytes(f) for f in kept)
        s.recent = kept


def _content_bytes(f: ContextFragment) -> int:
    return len(f.content.encode("utf-8"))


def drop_recent(s: UserMemoryState) -> None:
    """Vouch for no round any more (a round failed or collided and may have stored fragments
    this state never saw, or the user was forgotten)."""
    s.recent = []
    s.recent_from = 0


def round_failed(
    s: UserMemoryState,
    record: RoundRecord,
    error: str,
    now: float,
    cfg: MemoryConfig,
    started: bool = True,
    batch: list[ChatTurn] | None = None,
) -> None:
    """Keep the turns pending and back off, so a later round or an operator picks them up.
    What the round stored before it failed is not known here: no round is vouched for, and
    the thread's next round deletes the rows of this one (`started`: it ran under its number)
    before it stores the same turns again. Which turns it took (`batch`) is kept meanwhile."""
    drop_recent(s)
    s.rounds_failed += 1
    s.last_error = f"round {record.round_no} failed: {error}"
    ts = s.threads[record.thread_id]
    ts.not_before = now + cfg.failed_round_backoff_s
    if started and record.round_no > 0 and record.round_no not in ts.failed_rounds:
        ts.failed_rounds.append(record.round_no)
        del ts.failed_rounds[:-MAX_FAILED_ROUNDS]
        if batch is not None:
            ts.failed_batches[str(record.round_no)] = [
                identity_digest(turn_identity(t)) for t in batch
            ]
        _keep_failed_batches(ts)
    _finish(record, "failed", now, error=error)


def failed_round_thread(s: UserMemoryState, round_no: int | None) -> str | None:
    """The thread whose round `round_no` failed after it started and whose rows are still
    to be swept (ThreadState.failed_rounds), if any."""
    if round_no is None:
        return None
    return next((k for k, ts in s.threads.items() if round_no in ts.failed_rounds), None)


def forgotten_parts(
    ts: ThreadState, round_no: int, fragment: Fragment
) -> list[tuple[ChatTurn, str | None]]:
    """What a forgotten row of the thread's failed round `round_no` takes out of its pending
    turns: (turn, None) for a turn the row quotes whole, (turn, what is left) for a long turn
    the slicer cut into pieces across rows, of which this row quotes some.

    Matched by identity, never by place in the pending list (turns delivered late but said
    earlier sort before those a round took): only turns that round took (when it recorded
    them, `ThreadState.failed_batches`), said at a position in the row's span, by the same
    speaker, with the row's line equal to the whole turn, else found verbatim inside it."""
    took = ts.failed_batches.get(str(round_no))
    span = range(fragment.start_pos, fragment.end_pos)
    turns = [
        t
        for t in ts.pending
        if t.position in span
        and (took is None or identity_digest(turn_identity(t)) in took)
        and t.content.strip()
    ]
    lines = [line for line in spoken_lines(fragment.content) if line.role and line.text]
    out: dict[int, str | None] = {}
    for n, turn in enumerate(turns):
        whole = _whole_turn(lines, turn)
        if whole is not None:
            out[n] = None
            del lines[whole[0] : whole[1]]
    for n, turn in enumerate(turns):
        if n in out:
            continue
        rest = turn.content
        for line in [ln for ln in lines if ln.role == turn.role]:
            found = piece_at(rest, line.text)
            if found is not None:
                left, right = rest[: found[0]], rest[found[1] :]
                apart = left[-1:].isalnum() and right[:1].isalnum()  # keep words apart
                rest = f"{left}{' ' if apart else ''}{right}"
                lines.remove(line)
        if rest != turn.content:
            out[n] = rest.strip() if normalise(rest) else None
    return [(turns[n], left) for n, left in sorted(out.items())]


def _whole_turn(lines: list[SpokenLine], turn: ChatTurn) -> tuple[int, int] | None:
    """The run of lines [i, j) that quotes the turn whole: one line, or several when the
    turn's own text has lines that look like a speaker's ("User: ..." quoted in a reply)."""
    target = turn.content.strip()
    for i, line in enumerate(lines):
        if line.role != turn.role:
            continue
        text = line.text
        for j in range(i + 1, len(lines) + 1):
            if text == target:
                return i, j
            if j == len(lines) or len(text) >= len(target):
                break
            text = f"{text}\n{lines[j].raw}"
    return None


def quoting_parts(ts: ThreadState, fragment: Fragment) -> list[tuple[ChatTurn, str | None]]:
    """What a forgotten row takes out of any pending turn of the thread that quotes it
    verbatim (a reply reading it back, "please remember this: ..."): its `quoted_texts` cut out
    where they stand whole in a turn; (turn, None) when nothing of the turn is left. The
    forget's shape, as `forgotten_parts` gives it, for `forget_turns`."""
    texts = quoted_texts(fragment.content)
    out: list[tuple[ChatTurn, str | None]] = []
    for turn in ts.pending:
        rest = cut_quotes(turn.content, texts)
        if rest != turn.content:
            out.append((turn, rest if any(c.isalnum() for c in rest) else None))
    return out


def forget_turns(
    s: UserMemoryState, thread_id: str, parts: list[tuple[ChatTurn, str | None]]
) -> int:
    """Take what a forget covered out of a thread's pending turns (`forgotten_parts`) before
    any round stored it for good: a turn quoted whole leaves, a long turn keeps what other
    rows quote. Dropped turns stay accepted identities (a re-send is still a no-op) but leave
    the counts, as a whole-user forget's pending turns do. Returns how many turns changed."""
    ts = s.threads.get(thread_id)
    if ts is None or not parts:
        return 0
    changed = {turn_identity(t): left for t, left in parts}
    kept: list[ChatTurn] = []
    for t in ts.pending:
        key = turn_identity(t)
        if key not in changed:
            kept.append(t)
        elif changed[key] is not None:
            kept.append(t.model_copy(update={"content": changed[key]}))
    ts.accepted -= len(ts.pending) - len(kept)  # accepted == indexed + pending
    ts.pending = kept
    ts.urgent = ts.urgent and bool(ts.pending)
    ts.trigger = ts.trigger if ts.pending else "handover"
    return len(parts)


def rewritten(s: UserMemoryState, fragments: list[Fragment], by_statement: bool = False) -> None:
    """Rows stored again with other contents (lines a forget took out): the published
    context shows the new contents, no round is vouched for (their held contents are old),
    and the profile facts they were credited with are inducted again from what they say now
    (a fact only a removed line stated goes)."""
    if not fragments:
        return
    drop_recent(s)
    for f in fragments:
        _drop_facts_of(s, f.id, by_statement, [f.id])
    new = {f.id: f.content for f in fragments}
    if s.context is not None and any(f.id in new for f in s.context.fragments):
        s.context = s.context.model_copy(
            update={
                "fragments": [
                    f.model_copy(update={"content": new[f.id]}) if f.id in new else f
                    for f in s.context.fragments
                ],
                "version": s.context.version + 1,
            }
        )


def shown_with_lines(s: UserMemoryState, content: str, quotes: bool, skip: set[str]) -> list[str]:
    """Ids of the published context's fragments that show a line of `content` (its quotes,
    `quotes`): a rewrite that takes those lines out checks what became of them."""
    if quotes:
        texts = quoted_texts(content)
    else:
        texts = [ln.text for ln in spoken_lines(content) if ln.role and ln.text]
    if s.context is None or not texts:
        return []
    return [
        f.id
        for f in s.context.fragments
        if f.id not in skip and not is_stub(f) and any(t in f.content for t in texts)
    ]


def after_lost_reply(
    s: UserMemoryState,
    check_ids: list[str],
    deleted_ids: list[str],
    rewritten: list[Fragment],
    checked: list[Fragment],
) -> tuple[list[str], list[Fragment]]:
    """What a rewrite's reply did not say of the rows the context showed with its lines
    (`check_ids`; `checked`: those still stored): gone ones (deleted, by an attempt whose reply
    was lost) and stored ones whose contents the context does not show."""
    done = set(deleted_ids) | {f.id for f in rewritten}
    found = {f.id: f for f in checked}
    shown = {f.id: f.content for f in s.context.fragments} if s.context is not None else {}
    gone = [i for i in check_ids if i not in done and i not in found]
    stale = [f for i, f in found.items() if i not in done and i in shown and shown[i] != f.content]
    return gone, stale


def keep_swept_rows(
    s: UserMemoryState, thread_id: str, rows: list[Fragment], failed: Collection[int]
) -> list[SweptRow]:
    """Keep what a forget needs of the rows of the thread's `failed` rounds that a round is
    about to sweep (read before the sweep, so a forget that comes after it finds them: in a
    later run, or when the sweeping round failed too; docs/ARCHITECTURE.md, "The round").
    Returns the entries the round sweeps now: these, and those an earlier sweeper of the
    `failed` rounds stored again (their lines are in its rows, which this round sweeps)."""
    fresh = [
        SweptRow(
            id=f.id,
            thread_id=thread_id,
            round_no=f.round_no,
            start_pos=f.start_pos,
            end_pos=f.end_pos,
            content=f.content,
        )
        for f in rows
    ]
    ids = {r.id for r in fresh}
    kept = [r for r in s.swept_rows if r.id not in ids] + fresh
    del kept[:-MAX_SWEPT_ROWS]
    size = 0
    for n in range(len(kept) - 1, -1, -1):
        size += len(kept[n].content.encode())
        if size > MAX_SWEPT_BYTES:
            del kept[: n + 1]
            break
    s.swept_rows = kept
    return [r for r in kept if r.id in ids or (r.thread_id == thread_id and r.swept_by in failed)]


def swept_row(s: UserMemoryState, fragment_id: str) -> SweptRow | None:
    """The kept row of a failed round with this id, if any (keep_swept_rows)."""
    return next((r for r in s.swept_rows if r.id == fragment_id), None)


def drop_swept_row(s: UserMemoryState, fragment_id: str) -> None:
    s.swept_rows = [r for r in s.swept_rows if r.id != fragment_id]


def as_fragment(row: SweptRow, user_id: str) -> Fragment:
    """A kept row as the fragment it was (what forgotten_parts and ForgetLines read)."""
    return Fragment(
        id=row.id,
        user_id=user_id,
        theme="",
        types=[],
        content=row.content,
        created_at=0.0,
        reinforced_at=0.0,
        round_no=row.round_no,
        thread_id=row.thread_id,
        start_pos=row.start_pos,
        end_pos=row.end_pos,
    )


def _keep_failed_batches(ts: ThreadState) -> None:
    """Batches of the failed rounds still listed only (bounded with them)."""
    listed = {str(n) for n in ts.failed_rounds}
    for key in [k for k in ts.failed_batches if k not in listed]:
        del ts.failed_batches[key]


def _finish(record: RoundRecord, status: str, now: float, **extra: object) -> None:
    record.status = status  # type: ignore[assignment]
    record.finished_at = now
    for key, value in extra.items():
        setattr(record, key, value)


def induction_stored(
    s: UserMemoryState,
    batch: list[FragmentRef],
    out: InductOutput,
    prices: PriceTable,
    by_statement: bool = False,
) -> None:
    """The merged profile is stored: only now does the cursor move (never backwards). Facts
    carry their sources (provenance for forget_fragment): `by_statement`, the fragments that
    state them (`out.fact_sources`), a restated fact gaining the new ones; before that, every
    fact new to the profile was credited to the whole batch."""
    if by_statement and out.fact_sources is not None:
        _attribute_by_statement(s, batch, out.profile, out.fact_sources)
    else:
        before = profile_facts(s.profile)
        after = profile_facts(out.profile)
        sources = {k: v for k, v in s.profile_sources.items() if k in after}
        for key in after:
            if key not in before or key not in sources:
                sources[key] = [r.id for r in batch][:MAX_FACT_SOURCES]
        s.profile_sources = sources
        s.profile = out.profile
    done = {r.id for r in batch}
    s.uninducted = [r for r in s.uninducted if r.id not in done]
    s.induction_cursor = max([s.induction_cursor, *(r.seq for r in batch)])
    s.inductions += 1
    s.ledger.add("induct", out.usage, prices)
    late = [i for i in s.forgotten_fragments if i in done]
    for fragment_id in late:  # forgotten while this induction ran
        forget_fragment_facts(s, fragment_id, by_statement=by_statement)


def induced_profile(s: UserMemoryState, batch: list[FragmentRef], out: InductOutput) -> UserProfile:
    """The profile `induction_stored(..., by_statement=True)` will store, without changing the
    state: what the induction publishes first (a fragment forgotten while it ran never shows)."""
    trial = UserMemoryState(
        profile=s.profile,
        profile_sources=s.profile_sources,
        profile_stated=s.profile_stated,
        forgotten_fragments=s.forgotten_fragments,
    ).model_copy(deep=True)
    induction_stored(trial, batch, out, PriceTable(), by_statement=True)
    return trial.profile


def _attribute_by_statement(
    s: UserMemoryState,
    batch: list[FragmentRef],
    profile: UserProfile,
    stated_by: dict[str, list[str]],
) -> None:
    """Store an induced profile with each fact's sources: the fragments that state it, or the
    whole batch when none could be told (a paraphrase). A fact the profile lost while the
    induction ran (a forget_fragment removed it from the profile it started from) stays out
    unless this batch stated it again."""
    before = profile_facts(s.profile)
    after = profile_facts(profile)
    stale = {k for k in after if k not in before and k not in stated_by}
    if stale:
        profile = without_facts(profile, stale)
    batch_ids = [r.id for r in batch]
    sources: dict[str, list[str]] = {}
    stated: dict[str, list[str]] = {}
    for key in profile_facts(profile):
        old = s.profile_sources.get(key, []) if key in before else []
        old_stated = s.profile_stated.get(key, []) if key in before else []
        new = stated_by.get(key)
        if new is None:
            src, said = old, old_stated
        else:
            src, said = _union(old, new or batch_ids), _union(old_stated, new)
        if src:
            sources[key] = src
            kept = [i for i in said if i in src]
            if kept:
                stated[key] = kept
    s.profile_sources = sources
    s.profile_stated = stated
    s.profile = profile


def _union(old: list[str], new: list[str]) -> list[str]:
    """Old then new ids, each once, the newest MAX_FACT_SOURCES."""
    merged = [i for i in old if i not in new] + list(dict.fromkeys(new))
    return merged[-MAX_FACT_SOURCES:]


def induction_refused(s: UserMemoryState, batch: list[FragmentRef], error: str) -> None:
    """The model refused this batch for good: the next one is half as long, at once; a single
    fragment it still refuses is left out of the profile, counted and named in last_error, so
    the fragments after it are inducted."""
    if len(batch) > 1:
        s.induction_batch_limit = max(1, len(batch) // 2)
        return
    skipped = batch[0].id
    s.uninducted = [r for r in s.uninducted if r.id != skipped]
    s.induction_skipped += 1
    s.last_error = (
        f"induction skipped fragment {skipped} ({s.induction_skipped} skipped in all): {error}"
    )[:1000]


def induction_grows(s: UserMemoryState, default: int) -> None:
    """After a stored induction, a shrunk batch limit doubles back towards the default."""
    if s.induction_batch_limit:
        doubled = s.induction_batch_limit * 2
        s.induction_batch_limit = 0 if doubled >= default else doubled


def mentions(s: UserMemoryState, fragment_id: str) -> bool:
    """Whether the state names the fragment: a source of a profile fact, waiting for induction,
    in the published context, or kept with the latest rounds' contents (`recent`)."""
    return (
        any(fragment_id in ids for ids in s.profile_sources.values())
        or any(r.id == fragment_id for r in s.uninducted)
        or (s.context is not None and any(f.id == fragment_id for f in s.context.fragments))
        or any(f.id == fragment_id for f in s.recent)
    )


def forget_fragment_facts(s: UserMemoryState, fragment_id: str, by_statement: bool = False) -> int:
    """Forget a fragment in the state: its profile facts are removed, it leaves the published
    context, and a later round or induction cannot bring it back. Returns how many profile
    facts were removed.

    `by_statement` (privacy first): a fact credited to the fragment stays only when another
    kept fragment states it; one whose statement could not be told apart (its sources are the
    whole batch) is removed, and the batch's other fragments are inducted again, so the facts
    they do state come back. Before that, a fact stayed while any other source remained."""
    _remember(s.forgotten_fragments, fragment_id, MAX_FORGOTTEN_FRAGMENTS)
    gone = _drop_facts_of(s, fragment_id, by_statement, [])
    if s.context is not None:
        s.context = without_forgotten(s.context, s.forgotten_fragments, s.profile)
    s.recent = [f for f in s.recent if f.id != fragment_id]
    return gone


def _drop_facts_of(
    s: UserMemoryState, fragment_id: str, by_statement: bool, again: list[str]
) -> int:
    """Profile facts credited to the fragment leave it (`forget_fragment_facts`); those no
    other kept fragment states are removed, and their other sources, plus `again`, are
    inducted again. Returns how many facts were removed."""
    forgotten = set(s.forgotten_fragments)
    gone: set[str] = set()
    for key, ids in list(s.profile_sources.items()):
        if fragment_id not in ids:
            continue
        rest = [i for i in ids if i != fragment_id]
        stated = [i for i in s.profile_stated.get(key, []) if i in rest and i not in forgotten]
        if rest and (stated or not by_statement):
            s.profile_sources[key] = rest
            if key in s.profile_stated:
                s.profile_stated[key] = stated
            continue
        gone.add(key)
        del s.profile_sources[key]
        s.profile_stated.pop(key, None)
        again.extend(i for i in rest if i not in forgotten and i not in again)
    if gone:
        s.profile = without_facts(s.profile, gone)
    if again:
        queued = {r.id for r in s.uninducted}
        s.uninducted.extend(
            FragmentRef(id=i, created_at=0.0, seq=0) for i in again if i not in queued
        )
    return len(gone)


def without_forgotten(
    context: InjectedContext, forgotten: list[str], profile: UserProfile
) -> InjectedContext:
    """The context without forgotten fragments and with the current profile (a new version
    when anything changed)."""
    dropped = set(forgotten)
    fragments = [f for f in context.fragments if f.id not in dropped]
    if len(fragments) == len(context.fragments) and context.profile == profile:
        return context
    return context.model_copy(
        update={"fragments": fragments, "profile": profile, "version": context.version + 1}
    )


def with_filled(context: InjectedContext, filled: list[ContextFragment]) -> InjectedContext:
    """The context with these contents in place of its stubs of the same ids (the publish
    activity filled them). Same version: the read model already holds them whole; a fragment
    forgotten meanwhile is no longer in the context and stays out."""
    found = {f.id: f for f in filled}
    if not found or not any(is_stub(f) and f.id in found for f in context.fragments):
        return context
    fragments = fill_stubs(context.fragments, found, keep_unfound=True)
    return context.model_copy(update={"fragments": fragments})


def forget_all(s: UserMemoryState, clear_backoff: bool = False) -> int:
    """Clear everything a later round or induction could resurrect; returns the events dropped.

    Identities already seen stay seen, so a re-send of old turns brings nothing back (and the
    caller sets the fence for messages said before it but never delivered). `clear_backoff`:
    the back-off of rounds that failed before (the forget cancels the running round, which
    counts as failed) is lifted too, so what is said after the forget is not held up.
    """
    dropped = len(s.pending_reinforce)
    for ts in s.threads.values():
        dropped += len(ts.pending)
        fenced(s, ts.pending)
        ts.accepted -= len(ts.pending)  # accepted == indexed + pending: these were dropped
        ts.pending = []
        ts.urgent = False
        ts.failed_rounds = []  # their rows went with the user's
        ts.failed_batches = {}
        if clear_backoff:
            ts.not_before = 0.0
    s.pending_reinforce = []
    s.swept_rows = []  # their words went with the user's rows
    s.uninducted = []
    s.tuned = {}
    s.profile = UserProfile()
    s.profile_sources = {}
    s.profile_stated = {}
    s.context = None
    drop_recent(s)
    s.last_error = None
    return dropped


def keep_receipt(s: UserMemoryState, receipt: ForgetReceipt) -> None:
    """Keep the newest forget receipts (bounded state)."""
    s.forget_receipts.append(receipt)
    del s.forget_receipts[:-MAX_FORGET_RECEIPTS]


def watermarks(s: UserMemoryState) -> dict[str, Watermark]:
    """Per-thread watermarks of the most recently active threads (bounded for the read model)."""
    recent = sorted(s.threads.items(), key=lambda kv: kv[1].last_seen)[-MAX_PUBLISHED_THREADS:]
    return {k: watermark(t) for k, t in recent}


def watermark(ts: ThreadState) -> Watermark:
    """A thread's published counts (accepted == indexed once nothing waits)."""
    return Watermark(accepted=ts.accepted, indexed=ts.indexed, pending_since=pending_since(ts))


def round_watermarks(
    s: UserMemoryState, thread_id: str, batch: list[ChatTurn]
) -> dict[str, Watermark]:
    """The watermarks a round publishes, as they will be once `batch` is indexed: the recent
    threads', and always the round's own thread, even when that thread is older than the most
    recent ones (a user with many threads whose oldest one becomes due)."""
    after = watermarks(s)
    ts = s.threads[thread_id]
    done = {turn_identity(t) for t in batch}
    rest = ts.model_copy(
        update={"pending": [t for t in ts.pending if turn_identity(t) not in done]}
    )
    after[thread_id] = Watermark(
        accepted=ts.accepted, indexed=ts.indexed + len(done), pending_since=pending_since(rest)
    )
    return after
