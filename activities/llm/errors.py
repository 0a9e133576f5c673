"""How an LLM call's failure leaves an activity: retryable or not, and under which `type`.

    MalformedModelOutputError, attempt <  max  -> "MalformedModelOutputRetry"  retryable
    MalformedModelOutputError, attempt >= max  -> "MalformedModelOutput"       non-retryable
    other MnemoflowError (InvalidInput, ...)   -> its own type                  non-retryable
    HTTP 429                                   -> "RateLimited"  retryable, next_retry_delay from
                                                  Retry-After when the provider sends one
    HTTP 408 / 409 / 5xx                       -> "ModelUnavailable"            retryable
    HTTP 400 / 413 / 422                       -> "InvalidInput"                non-retryable
    other HTTP 4xx (401, 402, 403, 404, ...)   -> "ModelRequestRejected"        non-retryable
    anything else (timeouts, connection)       -> unchanged, so Temporal retries it

The retryable malformed type differs from "MalformedModelOutput" on purpose: a workflow retry
policy that lists the non-retryable types of models.errors must still retry early attempts.
"""

from __future__ import annotations

import math
import time
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

from temporalio.exceptions import ApplicationError

from mnemoflow.models.errors import MalformedModelOutputError, MnemoflowError

MALFORMED_RETRY_TYPE = "MalformedModelOutputRetry"
RATE_LIMITED_TYPE = "RateLimited"
MODEL_UNAVAILABLE_TYPE = "ModelUnavailable"
MODEL_REJECTED_TYPE = "ModelRequestRejected"
INVALID_INPUT_TYPE = "InvalidInput"
#: A Retry-After beyond this is treated as this: a round's total retry budget is bounded anyway.
MAX_RETRY_AFTER_S = 3600.0
_INVALID_INPUT_STATUSES = frozenset({400, 413, 422})
_RETRYABLE_4XX = frozenset({408, 409, 429})


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of an openai/httpx-style error, if it carries one."""
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def retry_after_s(exc: BaseException) -> float | None:
    """Seconds the provider asked us to wait (Retry-After: seconds or an HTTP date)."""
    headers: Any = getattr(getattr(exc, "response", None), "headers", None)
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    raw = headers.get("retry-after")
    seconds: float | None = None
    try:
        if raw_ms is not None:
            seconds = float(raw_ms) / 1000.0
        elif raw is not None:
            seconds = float(raw)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(str(raw)).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def to_activity_error(
    exc: BaseException, *, operation: str, model: str, attempt: int, max_malformed_attempts: int
) -> BaseException:
    """The exception the activity should raise for `exc` (see the module table)."""
    where = f"{operation} with {model}"
    if isinstance(exc, MalformedModelOutputError):
        if attempt >= max_malformed_attempts:
            return ApplicationError(
                f"{where}: malformed output on attempt {attempt} of {max_malformed_attempts}, "
                f"giving up: {exc}",
                type=MalformedModelOutputError.type,
                non_retryable=True,
            )
        return ApplicationError(
            f"{where}: malformed output on attempt {attempt} of {max_malformed_attempts}: {exc}",
            type=MALFORMED_RETRY_TYPE,
        )
    if isinstance(exc, MnemoflowError):
        return ApplicationError(f"{where}: {exc}", type=exc.type, non_retryable=True)
    status = http_status(exc)
    if status is None:
        return exc
    message = f"{where}: HTTP {status}: {str(exc)[:300]}"
    if status == 429:
        delay = retry_after_s(exc)
        return ApplicationError(
            message,
            type=RATE_LIMITED_TYPE,
            next_retry_delay=timedelta(seconds=delay) if delay is not None else None,
        )
    if status >= 500 or status in _RETRYABLE_4XX:
        return ApplicationError(message, type=MODEL_UNAVAILABLE_TYPE)
    if status in _INVALID_INPUT_STATUSES:
        return ApplicationError(message, type=INVALID_INPUT_TYPE, non_retryable=True)
    if 400 <= status < 500:
        return ApplicationError(message, type=MODEL_REJECTED_TYPE, non_retryable=True)
    return exc
