"""Assembling the system prompt: core prompt, then profile, then fragments (docs/ARCHITECTURE.md).

The order is for the provider's KV cache: the core prompt never changes and the profile changes
rarely, so the bytes most likely to be reused come first and the per-turn fragments last. All
rendering is deterministic (fixed field order, business fields sorted by key) so that the same
memory always produces byte-identical text, which is what lets the cache hit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from mnemoflow.memory.profile_merge import PROFILE_SCALAR_FIELDS
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.profile import PROFILE_LIST_FIELDS, UserProfile

PROFILE_HEADING = "## What you know about this user"
FRAGMENTS_HEADING = "## Relevant memories"


def _one_line(text: str) -> str:
    # A value spanning lines could break the list (or smuggle in a heading): collapse it.
    return " ".join(text.split())


def _label(field: str) -> str:
    return field.replace("_", " ").capitalize()


def render_profile(profile: UserProfile) -> str:
    """The profile as a bullet list of its non-empty fields, in a fixed order ("" if empty).

    Scalars first (name, occupation, style), then list fields in PROFILE_LIST_FIELDS order with
    their items in stored order (which carries recency), then business fields sorted by key.
    """
    lines: list[str] = []
    for field in PROFILE_SCALAR_FIELDS:
        value = _one_line(getattr(profile, field) or "")
        if value:
            lines.append(f"- {_label(field)}: {value}")
    for field in PROFILE_LIST_FIELDS:
        items = [_one_line(item) for item in getattr(profile, field)]
        items = [item for item in items if item]
        if items:
            lines.append(f"- {_label(field)}: {'; '.join(items)}")
    for key in sorted(profile.business_fields):
        value = _one_line(profile.business_fields[key])
        if value and key.strip():
            # snake_case keys read as words, for a model as much as for a person
            lines.append(f"- {_label(_one_line(key))}: {value}")
    return "\n".join(lines)


_MONTHS = "January February March April May June July August September October November December"


def date_label(at: float) -> str:
    """`8 May 2023` (UTC) for a unix time; "" for 0 (unknown). Fixed English month names, so
    the same fragment always renders the same bytes whatever the locale."""
    if at <= 0:
        return ""
    t = time.gmtime(at)
    return f"{t.tm_mday} {_MONTHS.split()[t.tm_mon - 1]} {t.tm_year}"


def render_fragments(fragments: Sequence[ContextFragment]) -> str:
    """Fragments as a numbered list, `N. [theme | type, type | date] content` ("" if none).

    The date (when it was said) lets the model answer "when" questions.

    Continuation lines of multi-line content are indented so each fragment stays one item.
    """
    lines: list[str] = []
    number = 0
    for frag in fragments:
        content = frag.content.strip()
        if not content:
            continue
        number += 1
        body = "\n   ".join(line.rstrip() for line in content.splitlines())
        tag = _one_line(frag.theme)
        if frag.types:
            tag = f"{tag} | {', '.join(frag.types)}"
        if frag.created_at > 0:
            tag = f"{tag} | {date_label(frag.created_at)}"
        lines.append(f"{number}. [{tag}] {body}")
    return "\n".join(lines)


def assemble_system_prompt(
    core: str, profile: UserProfile, fragments: Sequence[ContextFragment]
) -> str:
    """Core prompt, then the profile section, then the memories section; empty ones omitted.

    With nothing to add the core prompt is returned unchanged.
    """
    sections = []
    profile_text = render_profile(profile)
    if profile_text:
        sections.append(f"{PROFILE_HEADING}\n{profile_text}")
    fragments_text = render_fragments(fragments)
    if fragments_text:
        sections.append(f"{FRAGMENTS_HEADING}\n{fragments_text}")
    if not sections:
        return core
    head = core.rstrip()
    return "\n\n".join([head, *sections] if head else sections)


def filter_in_window(
    fragments: Sequence[ContextFragment], thread_id: str, window_from: float | None
) -> list[ContextFragment]:
    """Drop fragments whose source messages are still in the model's window (no paying twice).

    The window holds the thread's messages said at or after `window_from` (None: none of this
    thread's messages are in it). A fragment is as old as its newest message (`created_at`), so
    it is dropped when it comes from this thread and `created_at >= window_from`: at least that
    message is still visible. Times, not positions, because other middleware rewrites the
    message list (docs/ARCHITECTURE.md, "Message identity"). Fragments of other threads, those
    without a thread (remembered explicitly) and those of unknown age are always kept.
    """
    if not thread_id or window_from is None:
        return list(fragments)
    return [
        f
        for f in fragments
        if not (f.thread_id == thread_id and f.created_at > 0 and f.created_at >= window_from)
    ]
