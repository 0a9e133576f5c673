"""The error vocabulary, in one place.

Every permanent failure leaves an activity or workflow as a non-retryable ApplicationError whose
`type` is one of the names below, so an operator can search for it in the Temporal UI:

    MnemoflowError
    ├── InvalidInputError          "InvalidInput"          caller sent something unusable
    ├── MalformedModelOutputError  "MalformedModelOutput"  the LLM kept answering outside the schema
    ├── PayloadTooLargeError       "PayloadTooLarge"       would exceed Temporal's payload limit
    ├── StaleEpochError            "StaleEpoch"            a store write from before a forget
    └── MemoryUnavailableError     "MemoryUnavailable"     (client side) a store is unreachable

Transient failures (network, 5xx, 429) are ordinary exceptions: Temporal's retry policy, the only
retry mechanism in the project, handles them.
"""

from __future__ import annotations


class MnemoflowError(Exception):
    """Base of every error mnemoflow raises on purpose."""

    type: str = "Mnemoflow"


class InvalidInputError(MnemoflowError, ValueError):
    """The caller sent something mnemoflow can never process."""

    type = "InvalidInput"


class MalformedModelOutputError(MnemoflowError):
    """A memory model's structured output could not be used."""

    type = "MalformedModelOutput"


class PayloadTooLargeError(MnemoflowError):
    """A payload would be rejected by Temporal (over its size limit)."""

    type = "PayloadTooLarge"


class StaleEpochError(MnemoflowError):
    """A store write carried a forget epoch older than the user's record: the user was
    forgotten after the write was asked for, so it is refused (docs/ARCHITECTURE.md, "Forget
    epochs"). Never retried: a retry carries the same epoch."""

    type = "StaleEpoch"


class MemoryUnavailableError(MnemoflowError):
    """A memory store (Temporal, Redis, Milvus) could not be reached in time."""

    type = "MemoryUnavailable"


NON_RETRYABLE_TYPES: tuple[str, ...] = (
    InvalidInputError.type,
    MalformedModelOutputError.type,
    PayloadTooLargeError.type,
)
