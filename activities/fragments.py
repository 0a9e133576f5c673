"""Fragment activities: index (embed + upsert), select (candidates + scoring), reinforce.

Index stores nothing that adds no fact to the user's memory (`adds_nothing`): a fragment whose
content one earlier fragment of the user already holds (`memory.text.restates`) is skipped, the
earlier one standing for both, and so is an exchange in which the human only asks and the reply
states nothing ("When did I move?" / "Let me check."). That is how a turn in which the agent only
read memory back ("What am I allergic to?" / "You are allergic to shellfish.") stays out of the
store, and how a fact told twice keeps one fragment; the round slices one batch of turns and
cannot see what earlier rounds stored. A changed detail (a new number, a new word of the
human's) is an update and always stored, and so is going back to an earlier value in the same
words (A, then B, then A again): the fragment holding A is superseded by B's (`changes`), so
the newest telling of A is news.

Each is a thin shell over the FragmentStore and the pure selection of memory.selection. Store
and network failures propagate unchanged so Temporal's retry policy retries them; permanent
problems (an unusable user or fragment id) become non-retryable ApplicationErrors whose `type`
is the searchable name from mnemoflow.models.errors.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import NamedTuple

from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.heartbeat import heartbeating
from mnemoflow.activities.llm.heuristic_rules import is_question, split_sentences
from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.memory.selection import select as select_fragments
from mnemoflow.memory.text import NEGATIONS, fact_tokens, restates, word_shingles
from mnemoflow.models.contracts import (
    ActivityName,
    DeleteFragmentsInput,
    DeleteFragmentsOutput,
    ForgetLines,
    IndexInput,
    IndexOutput,
    ReinforceInput,
    ReinforceOutput,
    SelectInput,
    SelectOutput,
)
from mnemoflow.models.corpus import DELETE_STEP
from mnemoflow.models.errors import InvalidInputError, PayloadTooLargeError, StaleEpochError
from mnemoflow.models.fragments import (
    Fragment,
    LineNote,
    SelectionLog,
    SpokenLine,
    cut_quoted_lines,
    quoted_texts,
    spoken_lines,
)

# Scoring-log lines returned per selection. With retrieve_k=None every fragment of the user is a
# candidate, and thousands of lines would approach Temporal's 2 MB payload limit; the best lines
# and every picked one are what debugging the formula needs.
MAX_LOG_CANDIDATES = 256
#: A new fragment is compared for repeats with the user's fragments of this many rounds before
#: its own ("memory read back" is mostly of what was said lately, and a change of a statement
#: said lately is among them) ...
REPEAT_ROUNDS = 32
#: ... and with this many of the user's stored fragments nearest to it by vector, whenever they
#: were said (an old fact read back, or changed since; a change shares a third of its words).
REPEAT_NEIGHBOURS = 32
#: At most this many peers, the newest (a bound on the work of a round with many fragments).
MAX_REPEAT_PEERS = 2000
_HUMAN_LINE = re.compile(r"^User(?: \([^)\n]*\))?:\s*(.*)$")
_ANY_SPEAKER = re.compile(r"^(?:User|Assistant)(?: \([^)\n]*\))?:")


@asynccontextmanager
async def _permanent_errors() -> AsyncIterator[None]:
    """Turn mnemoflow's permanent errors into non-retryable ApplicationErrors."""
    try:
        yield
    except (InvalidInputError, PayloadTooLargeError, StaleEpochError) as exc:
        raise ApplicationError(str(exc), type=exc.type, non_retryable=True) from exc


def asks_only(content: str) -> bool:
    """Whether the human side of a fragment (`User: ...` lines) only asks: it has human lines
    and every sentence of them is a question or a request to recall."""
    human = False
    asked: list[str] = []
    for line in content.splitlines():
        if _ANY_SPEAKER.match(line):
            match = _HUMAN_LINE.match(line)
            human = match is not None
            line = match.group(1) if match else ""
        if human:
            asked.extend(split_sentences(line))
    return bool(asked) and all(is_question(s) and not _states_in_passing(s) for s in asked)


# Where a question's clauses part: commas, colons, dashes, brackets, and the words that join a
# statement to a question ("..., now that I live in Berlin?", "I got a puppy and what ...?").
# Where a question's clauses part: commas, colons, dashes, brackets (_PUNCTUATION_BREAK), and
# the words that join a statement to a question ("..., now that I live in Berlin?", "I got a
# puppy and what ...?").
_PUNCTUATION_BREAK = re.compile(r"[,:;()\[\]\u2013\u2014]\s*|\s+-\s+")
_WORD_BREAK = re.compile(
    r"\b(?:and|but|so|since|because|as|now that|given that|considering|although|though)\b",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(
    r"\b(?:i|we)\s+\w|\b(?:i|we)['\u2019](?:m|ve|d|re|ll)\b|\bme\b|\b(?-i:us)\b|"
    r"\b(?:my|our)\s+\w+(?:\s+\w+)?\s+(?:is|are|was|were|has|have|had|just|got|will|"
    r"started|moved|lives?|works?)\b",
    re.IGNORECASE,
)
# A clause that opens as a question or a request to recall: it asks, whatever it holds.
_ASKING_OPENER = re.compile(
    r"^(?:(?:hey|hi|so|ok(?:ay)?|well|please|then)\s+)*(?:what|when|where|who|whom|whose|which|"
    r"why|how|do|does|did|don't|can|could|would|will|shall|should|is|isn't|are|aren't|am|was|"
    r"were|have|has|had|may|might|must|any|tell me|remind me|let me know|i wonder|wonder|"
    r"if|whether|or)\b",
    re.IGNORECASE,
)
# "Could you remember that my locker code is 4471?": a request to keep something, not to recall.
_KEEP_REQUEST = re.compile(
    r"\b(?:remember|note|keep in mind|don't forget|do not forget|write down|save)\s+(?:that\b|:|"
    r"(?=(?:my|our)\b[^?]*(?:\d|\b(?:is|are|was|were)\b)))",
    re.IGNORECASE,
)
_RECALL_OPENER = re.compile(r"\b(?:do|did) you (?:still )?(?:remember|recall|know)\b", re.I)
# "for my son Leo, who is allergic to eggs": a fact about someone, told in a relative clause.
_RELATIVE_FACT = re.compile(
    r"\b(?:my|our)\s+\w+(?:\s+[A-Z]\w*)?,?\s+(?:who|which|that)\s+(?:is|are|was|has|have|had)\b"
)
# Chinese: a clause of the asker's before the question word that tells a change (了) or a
# plan (a time ahead): "我怀孕了吃什么好", "我下周三去东京出差要带什么".
_ZH_QUESTION_WORD = re.compile(r"什么|哪|谁|怎么|多少|几|是否|([\u4e00-\u9fff])[不没]\1")
_ZH_TOLD = re.compile(r"了|刚|最近|下周|下星期|明天|后天|下个月|明年|今年|周末")


def _states_in_passing(question: str) -> bool:
    """Whether a question tells a fact on its way: "Since I moved to Berlin, where should I
    eat?", "Where should I eat now that I live in Berlin?", "Could you remember that my locker
    code is 4471?", "How do I cook for my son Leo who is allergic to eggs?", "我怀孕了吃什么
    好？". A clause that does not open as a question and carries a fact (the first person, a
    number or a name, and two content words or more) is a statement; so is a request to keep
    something. Such a fragment is judged as a statement (adds_nothing), never as a recall turn.
    (Chinese clauses split at "，" are sentences of their own already.)"""
    text = question.strip()
    if _KEEP_REQUEST.search(text) and not _RECALL_OPENER.search(text):
        return True
    if _RELATIVE_FACT.search(text):
        return True
    for part in _ZH_QUESTION_WORD.split(text) if _ZH_QUESTION_WORD.search(text) else ():
        if part and "我" in part and _ZH_TOLD.search(part):
            if len(fact_tokens(_ZH_TOLD.sub("", part))) >= 2:  # more than "我明天"
                return True
    segments = _PUNCTUATION_BREAK.split(text)
    for n, segment in enumerate(segments):
        # A leading segment ("Just moved to Berlin, ...", "New job at Google starting March
        # 3, ...") tells something when it names a place, a person or a number.
        clause = segment.strip(" ?？!.")
        if n < len(segments) - 1 and _tells(clause, named_too=True):
            return True
        if any(
            _tells(part.strip(" ?？!."), named_too=False) for part in _WORD_BREAK.split(segment)
        ):
            return True
    return False


# A segment that only places the question ("as mentioned on 3 June", "in July 2023",
# "based on Tim's collections"): a name or a number in it is no news.
_REFERENCE_OPENER = re.compile(
    r"^(?:as|on|in|at|by|for|from|with|about|around|after|before|during|since|until|based on|"
    r"according to|apart from|besides|other than)\b",
    re.IGNORECASE,
)


def _tells(clause: str, named_too: bool) -> bool:
    """Whether a clause of a question is a statement that carries a fact: it does not open as a
    question, and it speaks of the asker (or, `named_too`, names something or has a number),
    with two content words or more."""
    if not clause or _ASKING_OPENER.match(clause):
        return False
    words = clause.split()
    named = (
        named_too
        and not _REFERENCE_OPENER.match(clause)
        and (any(w[:1].isupper() for w in words[1:]) or any(ch.isdigit() for ch in clause))
    )
    return (named or _FIRST_PERSON.search(clause) is not None) and len(fact_tokens(clause)) >= 2


def _has_human(content: str) -> bool:
    return any(_HUMAN_LINE.match(line) for line in content.splitlines())


def replies(content: str) -> str:
    """The lines of a fragment that are not the human's (`Assistant ...:` and unlabelled)."""
    return _lines_of(content, human=False)


def _lines_of(content: str, human: bool) -> str:
    """The human's lines of a fragment (`User ...:`, and the lines under them), or the others."""
    out: list[str] = []
    said_by_human = False
    for line in content.splitlines():
        if _ANY_SPEAKER.match(line):
            said_by_human = _HUMAN_LINE.match(line) is not None
        if said_by_human == human:
            out.append(line)
    return "\n".join(out)


#: How many earlier fragments a recall turn may read back together (adds_nothing).
RECALL_SOURCES = 3


class Peer(NamedTuple):
    """An earlier fragment as the repeat filter compares with it."""

    tokens: set[str]  # memory.text.fact_tokens of its content
    content: str


def adds_nothing(fragment: Fragment, peers: list[Peer]) -> bool:
    """Whether the fragment holds no fact its user's memory lacks: the human only asks and the
    reply states nothing ("When did I move?" / "Let me check.") or only what the earlier
    fragments it shares most with hold (memory read back); or the human states only what one
    earlier fragment holds, word for word.

    A reply may paraphrase what memory holds (`restates` tolerates a share of new words), but
    never changes a number. What the human states is a repeat only when every word of it, and
    every pair of neighbouring words, is in one earlier fragment (`word_shingles`): "14 Elm
    Street" after "12 Elm Street", "May" after "June", "I" after "my wife", "was" after "is",
    or the same places in another order are updates, and are stored. So is a statement whose
    newest holder a later fragment changed (`changes`: A, then B, then A again). An explicit
    remember is always stored. `peers`: the user's earlier fragments, oldest first."""
    if fragment.explicit:
        return False
    # A fragment cut between a question and its answer can hold only the answer: with no human
    # line at all it is judged as a reply too.
    content = fragment.content
    labelled = any(_ANY_SPEAKER.match(line) for line in content.splitlines())
    asking = asks_only(content) or (labelled and not _has_human(content))
    if not asking:
        tokens = fact_tokens(content)
        told = _told(content)
        shingles = word_shingles(told)
        holders = [
            n
            for n, peer in enumerate(peers)
            if restates(tokens, peer.tokens, False)
            and _same_numbers(tokens, peer.tokens)
            and shingles <= word_shingles(peer.content)
        ]
        # The newest fragment holding it word for word stands for it, unless a later one
        # changed what it says: then telling it again goes back to it, and is news.
        return bool(holders) and not _changed_since(told, peers[holders[-1] + 1 :])
    # When the human only asks, what the fragment could add is in the reply; a reply's "no" or
    # "not" ("You haven't told me") states nothing about the user.
    tokens = fact_tokens(replies(content)) - NEGATIONS
    if not tokens:
        return True
    # A recall turn that answers several questions reads back several fragments: it adds
    # nothing when the few earlier fragments it shares most with hold what it says together
    # (which covers one fragment holding it all: that one shares the most).
    nearest = heapq.nlargest(RECALL_SOURCES, peers, key=lambda peer: len(tokens & peer.tokens))
    held = set().union(*(peer.tokens for peer in nearest))
    return restates(tokens, held, True) and _same_numbers(tokens, held)


def _told(content: str) -> str:
    """What the human states in a fragment: its human lines; unlabelled content (a slicer that
    dropped the speakers) counts as all told."""
    labelled = any(_ANY_SPEAKER.match(line) for line in content.splitlines())
    return _lines_of(content, human=True) if labelled else content


def _sentences(told: str) -> list[str]:
    """The sentences (CJK: clauses) of the human's lines, without speaker labels."""
    out: list[str] = []
    for line in told.splitlines():
        match = _HUMAN_LINE.match(line)
        out.extend(split_sentences(match.group(1) if match else line))
    return out


def _changed_since(told: str, later: list[Peer]) -> bool:
    """Whether a fragment after the one holding `told` word for word changed one of its
    statements (`changes`): "I moved to 14 Elm Street" after "I live at 12 Elm Street". Then the
    holder is superseded, and `told` said again is an update back to the earlier value."""
    said = [(word_shingles(s), fact_tokens(s)) for s in _sentences(told)]
    wanted = set().union(*(tokens for _, tokens in said))
    for peer in later:
        if not peer.tokens & wanted:  # nothing of it in common: no sentence of it changes one
            continue
        for other in _sentences(_told(peer.content)):
            theirs = fact_tokens(other)
            if not theirs & wanted:
                continue
            shingles = word_shingles(other)
            if any(_changes(m, a, shingles, theirs) for m, a in said):
                return True
    return False


#: Share of the smaller sentence's fact tokens two sentences share to be about one thing.
TOPIC_SHARE = 1 / 3


def changes(sentence: str, later: str) -> bool:
    """Whether `later` says something else about what `sentence` is about: neither holds the
    other word for word (`word_shingles`), they share a third of the smaller one's fact tokens,
    and either one's fact tokens are all in the other and a third of the larger one's ("I am
    vegan" / "I am not vegan any more"; not a lone "Leeds!" against a long sentence that ends
    in Leeds) or they share a pair of neighbouring words with a fact token in it ("ship my", "Elm
    Street", "快递"), which words shared by chance rarely are ("Leeds" in "a kettle from a shop
    in Leeds" against "ship my orders to ... Leeds")."""
    return _changes(
        word_shingles(sentence), fact_tokens(sentence), word_shingles(later), fact_tokens(later)
    )


def _changes(mine: set[str], a: set[str], theirs: set[str], b: set[str]) -> bool:
    """`changes` on the sentences' shingles (mine, theirs) and fact tokens (a, b)."""
    if mine <= theirs or theirs <= mine:
        return False
    shared = a & b
    if not shared or len(shared) < TOPIC_SHARE * min(len(a), len(b)):
        return False
    if shared in (a, b) and len(shared) >= TOPIC_SHARE * max(len(a), len(b)):
        return True
    return any(" " in pair and fact_tokens(pair) & shared for pair in mine & theirs)


def _same_numbers(tokens: set[str], earlier: set[str]) -> bool:
    """Whether every token with a digit in it (an amount, a date, a house or order number) is
    one the earlier fragments hold: a changed number is never paraphrase."""
    return all(t in earlier for t in tokens if any(ch.isdigit() for ch in t))


def new_information(fragments: list[Fragment], earlier: list[Fragment]) -> list[Fragment]:
    """The fragments that add something to `earlier` (stored fragments of other rounds; each
    fragment is compared with its own user's only, and a retried index compares with nothing
    of its own round)."""
    rounds = {(f.user_id, f.round_no) for f in fragments}
    peers: dict[str, list[Peer]] = {}
    for f in sorted(earlier, key=lambda f: (f.created_at, f.round_no)):  # oldest first
        if (f.user_id, f.round_no) not in rounds:
            peers.setdefault(f.user_id, []).append(Peer(fact_tokens(f.content), f.content))
    return [f for f in fragments if not adds_nothing(f, peers.get(f.user_id, []))]


async def only_new(
    store: FragmentStore, fragments: list[Fragment], query: str | None = None
) -> list[Fragment]:
    """The fragments that add something to their users' stored memory (`new_information`
    against each user's `FragmentStore.repeat_peers`: the fragments of the last REPEAT_ROUNDS
    rounds and the REPEAT_NEIGHBOURS nearest each new one, at most MAX_REPEAT_PEERS); what a
    round's store step upserts. The read is bounded by those, not by the user's history.
    `query`: the selection query that follows, embedded in the same forward pass."""
    if not fragments:
        return []
    earlier: list[Fragment] = []
    for user in sorted({f.user_id for f in fragments}):
        mine = [f for f in fragments if f.user_id == user]
        rows = await store.repeat_peers(
            user, mine, rounds=REPEAT_ROUNDS, neighbours=REPEAT_NEIGHBOURS, query=query
        )
        earlier.extend(rows[-MAX_REPEAT_PEERS:])
    return new_information(fragments, earlier)


async def sweep_failed_rounds(
    store: FragmentStore, corpus: SearchCorpus | None, user_id: str, rounds: Sequence[int]
) -> tuple[int, list[Fragment]]:
    """Delete the rows that the user's failed `rounds` stored before they failed (no completed
    round owns them, docs/ARCHITECTURE.md "The round"); returns how many rows were deleted and
    the rows swept as they were (a forget of one that comes after the sweep finds its lines with
    them). Explicit fragments are never touched."""
    failed = sorted({int(n) for n in rounds if int(n) > 0})
    swept = [f for f in await store.of_rounds(user_id, failed) if not f.explicit]
    doomed = [f.id for f in swept]
    if not doomed:
        return 0, []
    deleted = await store.delete(user_id, doomed)
    if corpus is not None:
        await corpus.remove(user_id, doomed)
    return deleted, swept


def bounded_log(log: SelectionLog, limit: int = MAX_LOG_CANDIDATES) -> SelectionLog:
    """The log with at most `limit` best lines plus every picked line, in score order."""
    if len(log.candidates) <= limit:
        return log
    kept = [c for i, c in enumerate(log.candidates) if i < limit or c.picked]
    return log.model_copy(update={"candidates": kept})


class FragmentActivities:
    """Activities over one FragmentStore (shared by every activity task of the worker)."""

    def __init__(
        self,
        store: FragmentStore,
        corpus: SearchCorpus | None = None,
        *,
        skip_repeats: bool = True,
    ) -> None:
        """`corpus`: the users' corpus versions, moved after every write and delete.
        `skip_repeats`: index leaves out fragments that only repeat stored ones."""
        self.store = store
        self.corpus = corpus
        self.skip_repeats = skip_repeats

    @activity.defn(name=ActivityName.INDEX)
    async def index(self, inp: IndexInput) -> IndexOutput:
        """Embed and upsert the fragments that add something to the user's memory; a retry
        rewrites the same rows (business-id keys) and skips the same repeats. Returns the ids
        written."""
        async with _permanent_errors(), heartbeating():
            fragments = list(inp.fragments)
            if self.skip_repeats:
                fragments = await only_new(self.store, fragments)
            written = await self.store.upsert_vectors(fragments, epoch=inp.epoch)
            if self.corpus is not None:
                await self.corpus.added([f for f, _ in written])
        return IndexOutput(ids=[f.id for f, _ in written])

    @activity.defn(name=ActivityName.SELECT)
    async def select(self, inp: SelectInput) -> SelectOutput:
        """Score the user's candidates for the query and return the ranked fragments and log."""
        config = inp.config
        async with _permanent_errors():
            candidates = await self.store.candidates(
                inp.user_id, inp.query, config.retrieve_k, config.always_inject_types
            )
        selection = select_fragments(
            candidates,
            inp.params,
            config,
            inp.now,
            theme=inp.theme,
            params_source=inp.params_source,
        )
        size = inp.limit or config.published_candidates
        return SelectOutput(fragments=selection.ranked[:size], log=bounded_log(selection.log))

    @activity.defn(name=ActivityName.REINFORCE)
    async def reinforce(self, inp: ReinforceInput) -> ReinforceOutput:
        """Strengthen the fragments one model call used, once per call id."""
        async with _permanent_errors():
            updated = await self.store.reinforce(
                inp.user_id, inp.fragment_ids, inp.call_id, inp.now, epoch=inp.epoch
            )
        return ReinforceOutput(updated=updated)

    @activity.defn(name=ActivityName.DELETE_FRAGMENTS)
    async def delete_fragments(self, inp: DeleteFragmentsInput) -> DeleteFragmentsOutput:
        """Delete some (ids) or all (ids None) of the user's fragments; idempotent. Heartbeats
        while it runs, so a forget whose worker died is retried elsewhere in seconds."""
        async with _permanent_errors(), heartbeating():
            if inp.ids is None:
                deleted = await self.store.delete_user(inp.user_id, epoch=inp.epoch)
                if self.corpus is not None:
                    await self.corpus.delete_user(inp.user_id)
            else:
                rows = await self.store.get(inp.user_id, inp.read) if inp.read else []
                if inp.read_rounds:  # a failed round's rows, before a sweep deletes them
                    rounds = sorted(set(inp.read_rounds))
                    rows += [
                        f for f in await self.store.of_rounds(inp.user_id, rounds) if not f.explicit
                    ]
                deleted = await self.store.delete(inp.user_id, inp.ids) if inp.ids else 0
                if self.corpus is not None and inp.ids:
                    await self.corpus.remove(inp.user_id, inp.ids)
                gone: list[str] = []
                rewritten: list[Fragment] = []
                if inp.forget_lines is not None:
                    gone, rewritten = await self._forget_lines(
                        inp.user_id, inp.forget_lines, inp.epoch
                    )
                    deleted += len(gone)
                    # After the store changed, and on every attempt: a retry whose first try
                    # changed the rows finds nothing left to change, yet a search that read
                    # the rows before must still see the version move.
                    if self.corpus is not None:
                        await self.corpus.bump([inp.user_id], DELETE_STEP)
                checked = None
                if inp.forget_lines is not None and inp.forget_lines.check_ids:
                    checked = await self.store.get(inp.user_id, inp.forget_lines.check_ids)
                return DeleteFragmentsOutput(
                    deleted=deleted,
                    rows=rows,
                    deleted_ids=gone,
                    rewritten=rewritten,
                    checked=checked,
                )
        return DeleteFragmentsOutput(deleted=deleted)

    async def _forget_lines(
        self, user_id: str, spec: ForgetLines, epoch: int | None = None
    ) -> tuple[list[str], list[Fragment]]:
        """Take the forgotten row's lines out of the rows `spec` names: delete those left with
        none, store the others again without them. Returns (deleted ids, rows rewritten)."""
        # Each line once: a line said again elsewhere (a canned reply) is another turn.
        forgotten = Counter((ln.role, ln.text) for ln in spoken_lines(spec.content) if ln.role)
        gone: list[str] = []
        kept: list[Fragment] = []
        skip = set(spec.skip_ids)
        rows = [
            row
            for row in await self.store.all_for_user(user_id)
            if spec.round_no in (None, row.round_no)
            and not row.explicit
            and row.id not in skip
            and (spec.quotes or (row.end_pos > spec.start_pos and row.start_pos < spec.end_pos))
        ]
        if spec.quotes:
            quotes = quoted_texts(spec.content)
            for row in rows:
                content = cut_quoted_lines(row.content, quotes)
                if content is None:
                    gone.append(row.id)
                elif content != row.content:
                    # the notes may hold the cut words (facts, keywords): they go with them
                    kept.append(row.model_copy(update={"content": content, "notes": []}))
            rows = []
        # The rows most inside the span first: that is where the forgotten turns went.
        inside = min(spec.end_pos, max(spec.start_pos, 0))
        for row in sorted(rows, key=lambda r: (abs(r.start_pos - inside), r.id)):
            lines = spoken_lines(row.content)
            left = []
            for ln in lines:
                if forgotten[(ln.role, ln.text)] > 0:
                    forgotten[(ln.role, ln.text)] -= 1
                else:
                    left.append(ln)
            if len(left) == len(lines):
                continue
            if any(ln.role for ln in left):
                content = "\n".join(ln.raw for ln in left)
                kept.append(
                    row.model_copy(update={"content": content, "notes": _kept_dates(row, left)})
                )
            else:
                gone.append(row.id)
        if gone:
            await self.store.delete(user_id, gone)
        if kept:
            await self.store.upsert_vectors(kept, epoch=epoch)
        return gone, kept


def _kept_dates(row: Fragment, left: list[SpokenLine]) -> list[LineNote]:
    """The notes of a row rewritten without some lines: for each line left, only the dates
    shown with it (its own words name them); the indexed terms go, since the fragment's facts
    and keywords may hold the forgotten lines' words. None when the notes did not match the
    lines one for one."""
    lines = spoken_lines(row.content)
    if len(row.notes) != len(lines):
        return []
    when: dict[str, str] = {}
    for line, note in zip(lines, row.notes, strict=True):
        when.setdefault(line.raw, note.when)
    return [LineNote(when=when.get(line.raw, "")) for line in left]
