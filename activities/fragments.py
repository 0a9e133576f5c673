"""Fragment activities: index (embed + upsert), select (candidates + scoring), reinforce.

Index stores nothing that adds no fact to the user's memory (`adds_nothing`): a fragment whose
content one earlier fragment of the user already holds (`memory.text.restates`) is skipped, the
earlier one standing for both, and so is an exchange in which the human only asks and the reply
states nothing ("When did I move?" / "Let me check."). That is how a turn in which the agent only
read memory back ("What am I allergic to?" / "You are allergic to shellfish.") stays out of the
store, and how a fact told twice keeps one fragment; the round slices one batch of turns and
cannot see what earlier rounds stored. A changed detail (a new number, a new word of the
human's) is an update and always stored.

Each is a thin shell over the FragmentStore and the pure selection of memory.selection. Store
and network failures propagate unchanged so Temporal's retry policy retries them; permanent
problems (an unusable user or fragment id) become non-retryable ApplicationErrors whose `type`
is the searchable name from mnemoflow.models.errors.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from temporalio import activity
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.heartbeat import heartbeating
from mnemoflow.activities.llm.heuristic_rules import is_question, split_sentences
from mnemoflow.activities.search_corpus import SearchCorpus
from mnemoflow.memory.selection import select as select_fragments
from mnemoflow.memory.text import NEGATIONS, fact_tokens, restates
from mnemoflow.models.contracts import (
    ActivityName,
    DeleteFragmentsInput,
    DeleteFragmentsOutput,
    IndexInput,
    IndexOutput,
    ReinforceInput,
    ReinforceOutput,
    SelectInput,
    SelectOutput,
)
from mnemoflow.models.errors import InvalidInputError, PayloadTooLargeError
from mnemoflow.models.fragments import Fragment, SelectionLog

# Scoring-log lines returned per selection. With retrieve_k=None every fragment of the user is a
# candidate, and thousands of lines would approach Temporal's 2 MB payload limit; the best lines
# and every picked one are what debugging the formula needs.
MAX_LOG_CANDIDATES = 256
#: The user's newest fragments a new one is compared with for repeats (a bound on the work).
MAX_REPEAT_PEERS = 2000
_HUMAN_LINE = re.compile(r"^User(?: \([^)\n]*\))?:\s*(.*)$")
_ANY_SPEAKER = re.compile(r"^(?:User|Assistant)(?: \([^)\n]*\))?:")


@asynccontextmanager
async def _permanent_errors() -> AsyncIterator[None]:
    """Turn mnemoflow's permanent errors into non-retryable ApplicationErrors."""
    try:
        yield
    except (InvalidInputError, PayloadTooLargeError) as exc:
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


_CLAUSE_BREAK = re.compile(r"[,:\u2013\u2014]\s+|\s+-\s+")
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i’m|i've|i’ve|i'd|i’d|my|me|we|we're|our|us)\b", re.I)


def _states_in_passing(question: str) -> bool:
    """Whether a question tells a fact about the asker on its way ("Since I moved to Berlin,
    where should I eat?"): a clause before its last comma that is no question itself, speaks
    in the first person and holds two or more content words. (Chinese clauses are sentences
    of their own already: split_sentences cuts at "，".)"""
    clauses = _CLAUSE_BREAK.split(question.strip())
    return any(
        not is_question(clause)
        and _FIRST_PERSON.search(clause) is not None
        and len(fact_tokens(clause)) >= 2
        for clause in clauses[:-1]
    )


def _has_human(content: str) -> bool:
    return any(_HUMAN_LINE.match(line) for line in content.splitlines())


def replies(content: str) -> str:
    """The lines of a fragment that are not the human's (`Assistant ...:` and unlabelled)."""
    out: list[str] = []
    human = False
    for line in content.splitlines():
        if _ANY_SPEAKER.match(line):
            human = _HUMAN_LINE.match(line) is not None
        if not human:
            out.append(line)
    return "\n".join(out)


#: How many earlier fragments a recall turn may read back together (adds_nothing).
RECALL_SOURCES = 3


def adds_nothing(fragment: Fragment, peers: list[set[str]]) -> bool:
    """Whether the fragment holds no fact its user's memory lacks: the human only asks and the
    reply states nothing ("When did I move?" / "Let me check.") or only what one earlier
    fragment holds (memory read back), or one earlier fragment holds all it says
    (`memory.text.restates`).

    `restates` tolerates a share of new words (a reply paraphrases what memory holds), but
    never a changed detail: a fragment with a number no earlier one holds, or a human line
    with a word no earlier one holds ("I live at 14 Elm Street now" after "... 12 Elm
    Street ..."), is an update and is stored."""
    # A fragment cut between a question and its answer can hold only the answer: with no human
    # line at all it is judged as a reply too.
    content = fragment.content
    labelled = any(_ANY_SPEAKER.match(line) for line in content.splitlines())
    asking = asks_only(content) or (labelled and not _has_human(content))
    # When the human only asks, what the fragment could add is in the reply; a reply's "no" or
    # "not" ("You haven't told me") states nothing about the user.
    tokens = fact_tokens(replies(content)) - NEGATIONS if asking else fact_tokens(content)
    if asking and not tokens:
        return True
    if not asking:
        # Unlabelled content (a slicer that dropped the speakers) counts as all told.
        told = fact_tokens(_human_lines(content) if labelled else content)
        return any(
            restates(tokens, other, False)
            and _same_numbers(tokens, other)
            and _holds_all(told, other)
            for other in peers
        )
    # A recall turn that answers several questions reads back several fragments: it adds
    # nothing when the few earlier fragments it shares most with hold what it says together
    # (which covers one fragment holding it all: that one shares the most).
    nearest = heapq.nlargest(RECALL_SOURCES, peers, key=lambda other: len(tokens & other))
    held = set().union(*nearest)
    return restates(tokens, held, True) and _same_numbers(tokens, held)


def _same_numbers(tokens: set[str], earlier: set[str]) -> bool:
    """Whether every token with a digit in it (an amount, a date, a house or order number) is
    one the earlier fragments hold: a changed number is never paraphrase."""
    return all(t in earlier for t in tokens if any(ch.isdigit() for ch in t))


def _holds_all(told: set[str], earlier: set[str]) -> bool:
    """Whether every word the human said is one the earlier fragment holds, or a short form of
    one ("St" for "Street"): the human's words are what an update changes."""
    missing = told - earlier
    return all(
        t.isalpha() and len(t) >= 2 and t not in NEGATIONS and any(e.startswith(t) for e in earlier)
        for t in missing
    )


def _human_lines(content: str) -> str:
    """The human's lines of a fragment (`User ...:`), the complement of `replies`."""
    out: list[str] = []
    human = False
    for line in content.splitlines():
        if _ANY_SPEAKER.match(line):
            human = _HUMAN_LINE.match(line) is not None
        if human:
            out.append(line)
    return "\n".join(out)


def new_information(fragments: list[Fragment], earlier: list[Fragment]) -> list[Fragment]:
    """The fragments that add something to `earlier` (the user's stored fragments of other
    rounds; a retried index compares with nothing of its own round)."""
    rounds = {f.round_no for f in fragments}
    peers = [fact_tokens(f.content) for f in earlier if f.round_no not in rounds]
    return [f for f in fragments if not adds_nothing(f, peers)]


async def only_new(store: FragmentStore, fragments: list[Fragment]) -> list[Fragment]:
    """The fragments that add something to their users' stored memory (`new_information`
    against the newest MAX_REPEAT_PEERS stored fragments); what a round's store step upserts."""
    if not fragments:
        return []
    earlier: list[Fragment] = []
    for user in sorted({f.user_id for f in fragments}):
        earlier.extend((await store.all_for_user(user))[-MAX_REPEAT_PEERS:])
    return new_information(fragments, earlier)


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
        """`corpus`: the Redis search corpus the hot path searches, kept in step with the store.
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
            written = await self.store.upsert_vectors(fragments)
            if self.corpus is not None:
                await self.corpus.add_best_effort([f for f, _ in written], [v for _, v in written])
        return IndexOutput(ids=[f.id for f, _ in written])

    @activity.defn(name=ActivityName.SELECT)
    async def select(self, inp: SelectInput) -> SelectOutput:
        """Score the user's candidates for the query and return the ranked fragments and log."""
        config = inp.config
        async with _permanent_errors():
            candidates = await self.store.candidates(inp.user_id, inp.query, config.retrieve_k)
        selection = select_fragments(
            candidates,
            inp.params,
            config,
            inp.now,
            theme=inp.theme,
            params_source=inp.params_source,
        )
        size = inp.limit or config.published_candidates
        if self.corpus is not None:
            await self.corpus.reconcile(self.store, inp.user_id)
        return SelectOutput(fragments=selection.ranked[:size], log=bounded_log(selection.log))

    @activity.defn(name=ActivityName.REINFORCE)
    async def reinforce(self, inp: ReinforceInput) -> ReinforceOutput:
        """Strengthen the fragments one model call used, once per call id."""
        async with _permanent_errors():
            updated = await self.store.reinforce(
                inp.user_id, inp.fragment_ids, inp.call_id, inp.now
            )
        return ReinforceOutput(updated=updated)

    @activity.defn(name=ActivityName.DELETE_FRAGMENTS)
    async def delete_fragments(self, inp: DeleteFragmentsInput) -> DeleteFragmentsOutput:
        """Delete some (ids) or all (ids None) of the user's fragments; idempotent."""
        async with _permanent_errors():
            if inp.ids is None:
                deleted = await self.store.delete_user(inp.user_id)
                if self.corpus is not None:
                    await self.corpus.delete_user(inp.user_id)
            else:
                deleted = await self.store.delete(inp.user_id, inp.ids)
                if self.corpus is not None:
                    await self.corpus.remove(inp.user_id, inp.ids)
        return DeleteFragmentsOutput(deleted=deleted)
