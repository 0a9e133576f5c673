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
from mnemoflow.memory.text import BUDGET_CHARS_PER_TOKEN, estimate_tokens
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.profile import PROFILE_LIST_FIELDS, UserProfile

PROFILE_HEADING = "## What you know about this user"
FRAGMENTS_HEADING = "## Relevant memories"
#: What a section adds after the core prompt (or the section before it): a blank line.
SECTION_BREAK = "\n\n"
#: The most of the memory budget the profile may take; the rest is the fragments' (the profile
#: is the same on every call, the fragments are what the question is about).
PROFILE_SHARE = 0.5
#: Which profile facts are kept first when the profile is over its share (rendering keeps the
#: fixed order): who the user is, what they must not be offered, the business facts of the
#: account, then the rest. List fields keep their newest items first.
PROFILE_PRIORITY: tuple[str, ...] = (
    "name",
    "occupation",
    "style",
    "constraints",
    "business_fields",
    "relationships",
    "goals",
    "values",
    "expertise",
    "interests",
    "hobbies",
)


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


#: Between the lines of one fragment's content: continuation lines are indented.
CONTINUATION = "\n   "


def fragment_tag(frag: ContextFragment) -> str:
    """`[theme | type, type | date] ` (with its trailing space), as an item shows it."""
    tag = _one_line(frag.theme)
    if frag.types:
        tag = f"{tag} | {', '.join(frag.types)}"
    if frag.created_at > 0:
        tag = f"{tag} | {date_label(frag.created_at)}"
    return f"[{tag}] "


def render_line(line: str) -> str:
    """One line of content (a turn, possibly of several physical lines) as an item shows it."""
    return CONTINUATION.join(part.rstrip() for part in line.splitlines())


def render_fragment(frag: ContextFragment, number: int) -> str:
    """One item of the list, `N. [theme | type, type | date] content` ("" if no content)."""
    content = frag.content.strip()
    if not content:
        return ""
    return f"{number}. {fragment_tag(frag)}{render_line(content)}"


def render_fragments(fragments: Sequence[ContextFragment]) -> str:
    """Fragments as a numbered list, `N. [theme | type, type | date] content` ("" if none).

    The date (when it was said) lets the model answer "when" questions.

    Continuation lines of multi-line content are indented so each fragment stays one item.
    """
    lines: list[str] = []
    for frag in fragments:
        item = render_fragment(frag, len(lines) + 1)
        if item:
            lines.append(item)
    return "\n".join(lines)


def budget_tokens(text: str) -> int:
    """What text costs in the memory budget (the one estimate, at the budget's ratio)."""
    return estimate_tokens(text, BUDGET_CHARS_PER_TOKEN)


def profile_section(profile: UserProfile) -> str:
    """The profile's section as the prompt carries it after the core prompt ("" if empty)."""
    text = render_profile(profile)
    return f"{SECTION_BREAK}{PROFILE_HEADING}\n{text}" if text else ""


def fragments_section(fragments: Sequence[ContextFragment]) -> str:
    """The memories' section as the prompt carries it after the profile ("" if none)."""
    text = render_fragments(fragments)
    return f"{SECTION_BREAK}{FRAGMENTS_HEADING}\n{text}" if text else ""


def memory_tokens(profile: UserProfile, fragments: Sequence[ContextFragment]) -> int:
    """What the memory adds to the system prompt, by the budget's estimate: the profile and the
    memories sections with their headings, numbering, tags and indentation. The measure the
    memory budget (`MemoryConfig.memory_budget_tokens`) bounds."""
    return budget_tokens(profile_section(profile) + fragments_section(fragments))


def profile_share(budget: int) -> int:
    """The most tokens the profile may take of a memory budget."""
    return int(budget * PROFILE_SHARE)


def fit_profile(profile: UserProfile, tokens: int) -> UserProfile:
    """The profile, cut to what its section can show in `tokens` (the whole profile if it fits).

    Facts are kept in PROFILE_PRIORITY order (list fields newest item first, business fields by
    key) while they fit; what is kept renders in the usual fixed order, so the same profile and
    budget always give the same bytes (the provider's cache). A value too long for what is left
    is left out, never cut mid-way (half a fact can be a wrong one).
    """
    if budget_tokens(profile_section(profile)) <= tokens:
        return profile
    # Each line (with the break before it) is counted alone: the estimate of a whole is never
    # more than the sum of its parts', so what is kept fits.
    room = tokens - budget_tokens(f"{SECTION_BREAK}{PROFILE_HEADING}")
    kept: dict[str, object] = {field: None for field in PROFILE_SCALAR_FIELDS}
    kept.update({field: [] for field in PROFILE_LIST_FIELDS})
    business: dict[str, str] = {}
    kept["business_fields"] = business

    def line_cost(label: str, value: str) -> int:
        return budget_tokens(f"\n- {label}: {value}")

    for field in PROFILE_PRIORITY:
        if field == "business_fields":
            for key in sorted(profile.business_fields):
                value = _one_line(profile.business_fields[key])
                if not value or not key.strip():
                    continue
                cost = line_cost(_label(_one_line(key)), value)
                if cost <= room:
                    business[key] = profile.business_fields[key]
                    room -= cost
        elif field in PROFILE_LIST_FIELDS:
            items: list[str] = []
            spent = 0
            for item in reversed(getattr(profile, field)):  # newest first
                if not _one_line(item):
                    continue
                trial = [item, *items]
                cost = line_cost(_label(field), "; ".join(_one_line(i) for i in trial))
                if cost - spent <= room:
                    items, room, spent = trial, room - (cost - spent), cost
            kept[field] = items
        else:
            value = _one_line(getattr(profile, field) or "")
            cost = line_cost(_label(field), value) if value else 0
            if value and cost <= room:
                kept[field] = getattr(profile, field)
                room -= cost
    return UserProfile.model_validate(kept)


def fit_memory(
    profile: UserProfile, fragments: Sequence[ContextFragment], budget: int
) -> tuple[UserProfile, list[ContextFragment]]:
    """The profile cut to its share of `budget`, and the longest head of `fragments` that fits
    the rest: the memory section never exceeds the budget by the budget's own estimate."""
    profile = fit_profile(profile, profile_share(budget))
    kept = list(fragments)
    while kept and memory_tokens(profile, kept) > budget:
        kept.pop()
    return profile, kept


def assemble_system_prompt(
    core: str,
    profile: UserProfile,
    fragments: Sequence[ContextFragment],
    budget: int | None = None,
) -> str:
    """Core prompt, then the profile section, then the memories section; empty ones omitted.

    With `budget` (the memory budget, tokens) what memory adds never exceeds it (`fit_memory`:
    the profile cut to its share, trailing fragments left out). With nothing to add the core
    prompt is returned unchanged.
    """
    if budget is not None:
        profile, fragments = fit_memory(profile, fragments, budget)
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
    return SECTION_BREAK.join([head, *sections] if head else sections)


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
    return [f for f in fragments if not in_window(f, thread_id, window_from)]


def in_window(fragment: ContextFragment, thread_id: str, window_from: float | None) -> bool:
    """Whether a fragment's source messages are still in the model's window (`filter_in_window`)."""
    if not thread_id or window_from is None:
        return False
    return (
        fragment.thread_id == thread_id
        and fragment.created_at > 0
        and fragment.created_at >= window_from
    )
