"""Agent tools over a user's memory: remember, recall, forget one memory, stats.

Each tool is bound to the user of the run that calls it (`runtime.context.user_id` or
`state["user_id"]`, read from the injected ToolRuntime); no tool takes a user id from the model,
so an agent can never reach another user's memory. `forget_memory` names the fragment in its
result's artifact (`forgotten_by`), so DurableMemoryMiddleware stops injecting it at once, for
the rest of the turn too.

A tool never fails the turn because of memory: it waits at most the client's `tool_timeout_s`
for an update (`memory_stats`: the hot path's `query_timeout_s`), and any memory error becomes a
message to the model (UNAVAILABLE, or what was wrong with its arguments). A forget is told as
it stands when the time is up: done, accepted and still under way (the user workflow recorded
it and finishes it, on another worker if this one died: FORGET_PENDING), or not confirmed
(FORGET_UNCONFIRMED); never failed or done when it was not (docs/ARCHITECTURE.md, "Invariants").
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from typing import Any, Literal

from langchain.tools import BaseTool, ToolRuntime, tool
from langchain_core.messages import ToolMessage

from mnemoflow.middleware.client import MemoryClient
from mnemoflow.middleware.store_items import STORE_THEME_PREFIX
from mnemoflow.middleware.window import resolve_user_id
from mnemoflow.models.errors import InvalidInputError

log = logging.getLogger(__name__)

#: Fragment types an explicit memory gets: high importance weighs like a decision.
IMPORTANCE_TYPES: dict[str, list[str]] = {"high": ["decision", "fact"], "normal": ["fact"]}
UNAVAILABLE = "Memory is unavailable right now; carry on without it."
#: A remember that failed may still land (the workflow finishes an update its caller gave up
#: on, and each call is its own event), so the model is not told it was lost: asked again, it
#: stored a second copy.
UNCONFIRMED = (
    "Memory did not confirm in time; it may still be saved. Do not ask to remember it again"
    " in this conversation."
)
#: A forget the user workflow accepted (durably: in its history) and had not finished when the
#: tool's time was up, e.g. while another worker takes over from one that died mid-forget.
FORGET_PENDING = (
    "Forgetting memory {id} is accepted and under way: memory has recorded the request and will"
    " finish it shortly. It is not used in this conversation any more."
)
#: A forget memory did not even accept in time (no worker, Temporal unreachable): it may still
#: happen (the request may be waiting for a worker), so the model is told neither way.
FORGET_UNCONFIRMED = (
    "Memory did not confirm forgetting {id} in time: it may not be forgotten yet. It is not"
    " used in this conversation any more; ask to forget it again later to make sure."
)
#: How long the other memories holding the same words may still take to be accepted once the
#: tool's time is up (the named one was accepted or answered by then).
COPIES_GRACE_S = 2.0
#: Key of a forgetting tool's artifact: the fragment ids the user asked to forget.
FORGET_ARTIFACT = "mnemoflow_forget"


def forgotten_by(message: ToolMessage) -> list[str] | None:
    """The fragment ids a forgetting tool's result names (None for any other tool's result):
    the middleware drops what the turn found before, so its next model call cannot inject them."""
    artifact = getattr(message, "artifact", None)
    if not isinstance(artifact, dict) or FORGET_ARTIFACT not in artifact:
        return None
    return [str(i) for i in artifact[FORGET_ARTIFACT] or ()]


def _tool_theme(theme: str) -> str:
    """The theme the model asked for; the store's own (`store:<key>`, middleware/store_items.py)
    is not the model's to write, or a remembered fact would pass for a store item."""
    theme = theme.strip()
    return "remembered" if not theme or theme.startswith(STORE_THEME_PREFIX) else theme


def _user(runtime: ToolRuntime[Any, Any]) -> str:
    return resolve_user_id(runtime.state or {}, runtime.context)


def _unavailable(tool_name: str, err: Exception) -> str:
    """What the model is told when memory failed it (logged; the turn goes on)."""
    log.warning("memory tool %s: memory unavailable: %r", tool_name, err)
    return UNAVAILABLE


def memory_tools(client: MemoryClient) -> list[BaseTool]:
    """The four memory tools, all acting on the calling run's user through `client`."""

    @tool
    async def remember_this(
        text: str,
        runtime: ToolRuntime[Any, Any],
        importance: Literal["normal", "high"] = "high",
        theme: str = "remembered",
    ) -> str:
        """Remember a fact about the user for future conversations (explicit, high importance)."""
        user_id = _user(runtime)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
        # The tool call id makes a retried call store the memory once.
        event_id = f"tool-{runtime.tool_call_id}-{digest}" if runtime.tool_call_id else None
        try:
            result = await client.remember(
                user_id,
                text,
                theme=_tool_theme(theme),
                types=IMPORTANCE_TYPES[importance],
                event_id=event_id,
                timeout_s=client.tool_timeout_s,
            )
        except InvalidInputError as err:  # the model can act on it; the turn goes on
            return f"Not remembered: {err}"
        except Exception as err:  # memory down or slow: never fail the turn
            _unavailable("remember_this", err)
            return UNCONFIRMED
        return f"Remembered (memory id {result.fragment_id})."

    @tool
    async def recall_memories(query: str, runtime: ToolRuntime[Any, Any], limit: int = 5) -> str:
        """Search the user's long-term memories for a query; best matches first, with ids."""
        user_id = _user(runtime)
        try:
            result = await client.recall(
                user_id, query, top_k=max(1, min(limit, 50)), timeout_s=client.tool_timeout_s
            )
        except InvalidInputError as err:  # e.g. an empty query: the model can ask again
            return f"Cannot search memory: {err}"
        except Exception as err:  # memory down or slow: never fail the turn
            return _unavailable("recall_memories", err)
        if not result.fragments:
            return "No memories found."
        lines = [
            f"- [{f.id}] ({f.theme}; score {f.score:.2f}) {' '.join(f.content.split())}"
            for f in result.fragments
        ]
        return "\n".join(lines)

    @tool(response_format="content_and_artifact")
    async def forget_memory(
        fragment_id: str, runtime: ToolRuntime[Any, Any]
    ) -> tuple[str, dict[str, list[str]]]:
        """Delete one of the user's memories by its id (as shown by recall_memories), and any
        other memory that holds the same words (the conversation it was said in)."""
        user_id = _user(runtime)
        # One deadline for the whole call: the named memory, then its copies.
        deadline = time.monotonic() + client.tool_timeout_s
        copies = await _copies(client, user_id, fragment_id)
        # Whatever the outcome, the rest of the turn must not inject them (forgotten_by).
        artifact = {FORGET_ARTIFACT: [fragment_id, *copies]}
        # The tool call id names the updates: a retried call is the same forget.
        call = runtime.tool_call_id or uuid.uuid4().hex

        def update_id(fid: str) -> str:
            return f"forget-{call}-{hashlib.sha256(fid.encode('utf-8')).hexdigest()[:12]}"

        try:
            # quotes: the words go from what is not stored yet, and from rows a round stored
            # after the copies were looked up, too
            result = await client.forget_fragment(
                user_id, fragment_id, quotes=True, update_id=update_id(fragment_id),
                deadline=deadline,
            )  # fmt: skip
        except InvalidInputError as err:  # e.g. an empty id, or the user is being forgotten
            return f"Not forgotten: {err}", artifact
        except Exception as err:  # not accepted in time: never fail the turn, never guess
            _unavailable("forget_memory", err)
            return FORGET_UNCONFIRMED.format(id=fragment_id), artifact
        also, pending, unconfirmed = 0, 0, 0
        until = max(deadline, time.monotonic() + COPIES_GRACE_S)
        for copy in copies:
            try:
                out = await client.forget_fragment(
                    user_id, copy, update_id=update_id(copy), deadline=until
                )
            except Exception as err:  # the named memory's outcome still stands
                log.warning("memory tool forget_memory: copy %s not confirmed: %r", copy, err)
                unconfirmed += 1
                continue
            pending += out.pending
            also += bool(out.deleted)
        tail = ""
        if pending or unconfirmed:
            state = "not confirmed yet" if unconfirmed else "under way"
            n = pending + unconfirmed
            tail = f" Forgetting {n} other memory holding the same words is {state}."
        more = f" and {also} other memory holding the same words" if also else ""
        if result.pending:
            done = f" Forgot {also} other memory holding the same words." if also else ""
            return FORGET_PENDING.format(id=fragment_id) + done + tail, artifact
        if result.deleted:
            return f"Forgot memory {fragment_id}{more}.{tail}", artifact
        return f"No memory with id {fragment_id}{more}.{tail}", artifact

    @tool
    async def memory_stats(runtime: ToolRuntime[Any, Any]) -> str:
        """How much the memory holds about the user: rounds, pending messages, profile state."""
        user_id = _user(runtime)
        try:
            # Inside a turn: the hot path's timeout, not the operator's.
            status = await client.status(user_id, timeout_s=client.query_timeout_s)
        except Exception as err:  # memory down or slow: never fail the turn
            return _unavailable("memory_stats", err)
        if status is None:
            return "No memories yet."
        ledger = status.ledger
        return (
            f"rounds completed {status.rounds_completed}, failed {status.rounds_failed}; "
            f"messages waiting {status.pending_turns}; profile updates {status.inductions}; "
            f"fragments not yet in the profile {status.uninducted}; "
            f"memory cost {ledger.cost:.6f} {ledger.currency}"
        )

    return [remember_this, recall_memories, forget_memory, memory_stats]


#: A memory's words shorter than this (normalised characters) are too common to look for.
MIN_COPY_CHARS = 16


async def _copies(client: MemoryClient, user_id: str, fragment_id: str) -> list[str]:
    """Ids of the user's other fragments that hold the named fragment's words (case and
    spacing aside): a fact the agent was asked to remember is usually also in the fragment
    of the conversation it was said in, and forgetting the memory must not leave it there.
    Found by the per-call search's Milvus reads (`MilvusSearch.copies_of`); none when that is
    unavailable."""
    searcher = client.searcher
    if searcher is None:
        return []
    try:
        return await searcher.copies_of(user_id, fragment_id, MIN_COPY_CHARS)
    except Exception:  # the copies are a courtesy: the named memory is forgotten regardless
        log.warning("memory search unavailable: only the named memory is forgotten")
        return []
