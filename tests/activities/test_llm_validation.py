"""validate_drafts and the error mapping: what an untrusted model answer becomes."""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from mnemoflow.activities.llm.base import MAX_FRAGMENT_BYTES, validate_drafts, within_bytes
from mnemoflow.activities.llm.errors import retry_after_s, to_activity_error
from mnemoflow.models.errors import InvalidInputError, MalformedModelOutputError
from mnemoflow.models.fragments import FragmentDraft


def _draft(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "theme": "orders",
        "types": ["fact"],
        "content": "order A-1",
        "start_idx": 0,
        "end_idx": 1,
    }
    base.update(overrides)
    return base


def test_valid_drafts_pass_through() -> None:
    (draft,) = validate_drafts([_draft()], n_turns=3)
    assert (draft.theme, draft.types, draft.content, draft.start_idx, draft.end_idx) == (
        "orders",
        ["fact"],
        "order A-1",
        0,
        1,
    )


def test_wrapper_object_and_pydantic_items_are_accepted() -> None:
    class Item:
        def model_dump(self) -> dict[str, object]:
            return _draft(content="from a model")

    drafts = validate_drafts({"fragments": [_draft(), Item()]}, n_turns=2)
    assert [d.content for d in drafts] == ["order A-1", "from a model"]


def test_unknown_types_are_dropped_and_none_left_means_chat() -> None:
    drafts = validate_drafts(
        [
            _draft(types=["FACT", "bogus", "fact", "preference"]),
            _draft(types=["opinion"]),
            _draft(types=[]),
            _draft(types="identity, decision"),
        ],
        n_turns=2,
    )
    assert [d.types for d in drafts] == [
        ["fact", "preference"],
        ["chat"],
        ["chat"],
        ["identity", "decision"],
    ]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [(-3, 99, (0, 4)), (4, 1, (1, 4)), (10, -10, (0, 4)), ("2", 3.0, (2, 3))],
)
def test_indexes_are_clamped_and_swapped(
    start: object, end: object, expected: tuple[int, int]
) -> None:
    (draft,) = validate_drafts([_draft(start_idx=start, end_idx=end)], n_turns=5)
    assert (draft.start_idx, draft.end_idx) == expected


def test_empty_content_is_dropped_and_theme_trimmed() -> None:
    drafts = validate_drafts(
        [_draft(content="   "), _draft(content=None), _draft(theme="x" * 500), _draft(theme=" ")],
        n_turns=2,
    )
    assert len(drafts) == 2
    assert drafts[0].theme == "x" * 200
    assert drafts[1].theme == "general"


def test_overflow_is_folded_into_the_last_draft_not_lost() -> None:
    raw = [_draft(content=f"detail {i}", start_idx=i, end_idx=i) for i in range(5)]
    drafts = validate_drafts(raw, n_turns=5, max_fragments=3)
    assert len(drafts) == 3
    assert drafts[2].content == "detail 2\ndetail 3\ndetail 4"
    assert (drafts[2].start_idx, drafts[2].end_idx) == (2, 4)


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        ("not a list", "must be a list"),
        (None, "must be a list"),
        ({"items": []}, "must be a list"),
        ([42], "must be an object"),
        ([_draft(start_idx="first")], "not an integer"),
        ([_draft(end_idx=True)], "boolean"),
        ([_draft(end_idx=1.5)], "not an integer"),
        ([{"theme": "t", "types": ["fact"], "content": "c", "end_idx": 0}], "no start_idx"),
        ([_draft(types=7)], "types must be a list"),
        ([_draft(content=["a"])], "content must be a string"),
        ([_draft(theme={"a": 1})], "theme must be a string"),
    ],
)
def test_structurally_unusable_output_is_malformed(raw: object, needle: str) -> None:
    with pytest.raises(MalformedModelOutputError, match=needle):
        validate_drafts(raw, n_turns=3)


def test_zero_turns_is_invalid_input() -> None:
    with pytest.raises(InvalidInputError):
        validate_drafts([_draft()], n_turns=0)


def test_empty_answer_is_allowed() -> None:
    assert validate_drafts([], n_turns=3) == []


def _status_error(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://127.0.0.1/chat/completions")
    response = httpx.Response(status, headers=headers, request=request)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=response)


def _mapped(exc: BaseException, attempt: int = 1) -> BaseException:
    return to_activity_error(
        exc, operation="slice", model="m", attempt=attempt, max_malformed_attempts=3
    )


def test_malformed_is_retryable_until_the_last_attempt() -> None:
    early = _mapped(MalformedModelOutputError("bad"), attempt=2)
    last = _mapped(MalformedModelOutputError("bad"), attempt=3)
    assert isinstance(early, ApplicationError) and not early.non_retryable
    assert isinstance(last, ApplicationError) and last.non_retryable
    assert last.type == "MalformedModelOutput" and "attempt 3 of 3" in last.message


@pytest.mark.parametrize(
    ("status", "kind", "non_retryable"),
    [
        (400, "InvalidInput", True),
        (413, "InvalidInput", True),
        (401, "ModelRequestRejected", True),
        (402, "ModelRequestRejected", True),
        (408, "ModelUnavailable", False),
        (409, "ModelUnavailable", False),
        (500, "ModelUnavailable", False),
        (503, "ModelUnavailable", False),
        (429, "RateLimited", False),
    ],
)
def test_http_statuses_map_to_error_types(status: int, kind: str, non_retryable: bool) -> None:
    err = _mapped(_status_error(status))
    assert isinstance(err, ApplicationError)
    assert (err.type, err.non_retryable) == (kind, non_retryable)
    assert err.next_retry_delay is None


def test_retry_after_forms() -> None:
    assert retry_after_s(_status_error(429, {"Retry-After": "12"})) == 12.0
    assert retry_after_s(_status_error(429, {"retry-after-ms": "1500"})) == 1.5
    assert (
        retry_after_s(_status_error(429, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0
    )
    assert retry_after_s(_status_error(429, {"Retry-After": "soon"})) is None
    assert retry_after_s(_status_error(429, {"Retry-After": "999999"})) == 3600.0
    err = _mapped(_status_error(429, {"Retry-After": "3"}))
    assert isinstance(err, ApplicationError) and err.next_retry_delay == timedelta(seconds=3)


def test_timeouts_pass_through_unchanged() -> None:
    exc = httpx.ReadTimeout("slow")
    assert _mapped(exc) is exc


@pytest.mark.parametrize("unit", ["\U0001f600", "记忆", "word ", "\u00e9"])
def test_drafts_past_the_byte_bound_are_cut_to_fit_and_lose_nothing(unit: str) -> None:
    lines = [f"User: line {k} " + unit * 900 for k in range(60)]
    one_long_line = "Assistant: " + unit * 40_000
    big = FragmentDraft(theme="t", types=["fact"], content="\n".join(lines), start_idx=2, end_idx=5)
    long = FragmentDraft(theme="u", types=["chat"], content=one_long_line, start_idx=6, end_idx=6)
    small = FragmentDraft(theme="v", types=["chat"], content="short", start_idx=7, end_idx=7)
    out = within_bytes([big, long, small])
    assert all(len(d.content.encode()) <= MAX_FRAGMENT_BYTES for d in out)
    assert out[-1] == small
    from_big = [d for d in out if d.theme == "t"]
    assert "\n".join(d.content for d in from_big) == big.content, "cut between lines, in order"
    assert all((d.types, d.start_idx, d.end_idx) == (["fact"], 2, 5) for d in from_big)
    from_long = [d for d in out if d.theme == "u"]
    assert all(d.content.startswith("Assistant: ") for d in from_long), "each piece says who"
    body = "".join(d.content.removeprefix("Assistant: ") for d in from_long)
    assert "Assistant: " + body == one_long_line
    assert len(from_long) >= 2 or len(one_long_line.encode()) <= MAX_FRAGMENT_BYTES
    if " " in unit:  # cut at a space, never inside a word
        assert all(d.content.endswith(" ") for d in from_long[:-1])
    assert within_bytes([small]) == [small]


def test_a_long_line_is_cut_at_sentence_ends_when_there_are_some() -> None:
    sentences = [f"我妹妹住在上海{k}号。" for k in range(6000)]
    line = "User: " + "".join(sentences)
    draft = FragmentDraft(theme="t", types=["fact"], content=line, start_idx=0, end_idx=0)
    pieces = within_bytes([draft])
    assert len(pieces) >= 2 and all(p.content.startswith("User: ") for p in pieces)
    assert all(p.content.endswith("。") for p in pieces)
    assert "User: " + "".join(p.content.removeprefix("User: ") for p in pieces) == line
