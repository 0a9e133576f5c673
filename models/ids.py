"""Deterministic, safely encoded identifiers derived from business ids.

User ids can be anything a caller sends (quotes, slashes, unicode, thousands of characters), so
they never appear raw in workflow ids, Milvus filter expressions or Redis keys: those use a hash.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import unicodedata
import uuid
from collections.abc import Sequence

from mnemoflow.models.errors import InvalidInputError

MAX_USER_ID_CHARS = 4096
USER_WORKFLOW_PREFIX = "mnemoflow-user"
#: Characters of the user id shown in its workflow id (the hash keeps long ids unique).
SLUG_CHARS = 40
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9_.@-]+")
_SLUG_PUNCT = frozenset("_.@-")


def validate_user_id(user_id: object) -> str:
    """Return the user id, or raise InvalidInputError (a ValueError) with a message the caller
    can act on."""
    if not isinstance(user_id, str):
        raise InvalidInputError(f"user id must be a string, got {type(user_id).__name__}")
    if not user_id.strip():
        raise InvalidInputError(
            "user id is empty: pass runtime.context.user_id or state['user_id']"
        )
    if len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidInputError(
            f"user id is {len(user_id)} characters; at most {MAX_USER_ID_CHARS}"
        )
    if "\x00" in user_id:
        raise InvalidInputError("user id contains a NUL character")
    try:
        user_id.encode("utf-8")  # every key and id derived from it hashes its UTF-8 bytes
    except UnicodeEncodeError as err:
        raise InvalidInputError(
            f"user id is not valid Unicode text: a lone surrogate {user_id[err.start]!r} at "
            f"position {err.start} (decode the id's bytes before passing it)"
        ) from None
    return user_id


def user_key(user_id: str) -> str:
    """A stable hex key of the user id: safe in filters, keys and ids (32 hex chars)."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:32]


def user_workflow_id(user_id: str) -> str:
    """Workflow id of the user's UserMemoryWorkflow: readable slug plus the hash key.

    The hash of the whole id keeps workflow ids unique; the slug only lets an operator recognise
    the user in the Temporal UI, so it may lose characters.
    """
    return f"{USER_WORKFLOW_PREFIX}-{workflow_slug(user_id)}-{user_key(user_id)[:20]}"


def workflow_slug(user_id: str) -> str:
    """The readable part of a user's workflow id: letters and digits of any script.

    An id whose first SLUG_CHARS characters are ASCII gets the slug it always had (running
    workflows keep their ids). Otherwise the head is NFKC-normalised (full-width forms become
    plain ones) and every run of characters that is not a letter, mark or digit of some script,
    nor one of `_.@-`, becomes one `_`: no spaces, controls, bidi overrides, quotes or slashes
    reach the id, and names in Chinese, Cyrillic or Arabic stay readable.
    """
    head = user_id[:SLUG_CHARS]
    if head.isascii():
        return _SLUG_UNSAFE.sub("_", head).strip("_") or "user"
    kept: list[str] = []
    for char in unicodedata.normalize("NFKC", head)[:SLUG_CHARS]:
        if char in _SLUG_PUNCT or unicodedata.category(char)[0] in "LMN":
            kept.append(char)
        elif not kept or kept[-1] != "_":
            kept.append("_")
    return "".join(kept).strip("_") or "user"


def round_workflow_id(user_workflow: str, round_no: int) -> str:
    """Workflow id of a round child: `<user workflow id>/round-<n>`."""
    return f"{user_workflow}/round-{round_no}"


def fragment_id(user_id: str, round_no: int, index: int) -> str:
    """Primary key of the index-th fragment of a round, so a retried index upserts the same row."""
    return f"{user_key(user_id)[:24]}-r{round_no}-f{index}"


def explicit_fragment_id(user_id: str, event_id: str) -> str:
    """Primary key of an explicitly remembered fragment, derived from its event id."""
    digest = hashlib.sha256(event_id.encode("utf-8")).hexdigest()[:16]
    return f"{user_key(user_id)[:24]}-m{digest}"


#: Longest thread id kept as it is. Chat platforms build long composite ids; a longer one is
#: shortened to its head plus a hash of the whole, the same for every writer, so it still names
#: exactly one thread (and fits the contracts' 512-character bound with room to spare).
MAX_THREAD_ID_CHARS = 256
_THREAD_HEAD_CHARS = 200


def thread_key(thread_id: str) -> str:
    """The thread id memory keys a thread by: itself when short and encodable, else a head
    (lone surrogates, a broken emoji, as U+FFFD) + "~" + a hash of the whole id."""
    unencodable = _LONE_SURROGATE.search(thread_id) is not None
    if len(thread_id) <= MAX_THREAD_ID_CHARS and not unencodable:
        return thread_id
    digest = hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    head = _LONE_SURROGATE.sub("\ufffd", thread_id[:_THREAD_HEAD_CHARS])
    return f"{head}~{digest}"


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def turns_event_id(thread_id: str, identities: Sequence[str]) -> str:
    """Event id of a hand-over of these message identities of a thread: the same messages give
    the same id, so a re-sent event is a no-op. An event with no messages (only chat usage) gets
    a fresh id."""
    if not identities:
        return f"usage-{uuid.uuid4().hex}"
    digest = hashlib.sha256("\x1f".join([thread_id, *identities]).encode("utf-8", "surrogatepass"))
    return f"turns-{digest.hexdigest()[:40]}"


def context_key(prefix: str, user_id: str) -> str:
    """Redis key of a user's published context (the hot path's one GET)."""
    return f"{prefix}ctx:{user_key(user_id)}"


def epoch_key(prefix: str, user_id: str) -> str:
    """Redis key of a user's forget epoch (docs/ARCHITECTURE.md, "Forget epochs"): how many
    whole-user forgets the user workflow made. Store writes carrying an older epoch are refused
    (activities/store_epochs.py) and agents stamp it on what they say (middleware/window.py)."""
    return f"{prefix}epoch:{user_key(user_id)}"


_UNQUERYABLE = re.compile(r"[\"'`\\\x00-\x1f\x7f]")
_HASHED = "sha256-"
#: Longest raw user id used as a search-attribute value (Temporal caps Keyword values at 2 KB).
MAX_SEARCH_USER_BYTES = 1000


def search_user_value(user_id: str, secret: bytes | None = None) -> str:
    """The MnemoflowUser search-attribute value: the raw id, or a keyed hash when pseudonymous.

    Search attributes are not encrypted by the payload codec, so with a secret the value is
    HMAC-SHA256(secret, user id): operators who know a user id and the secret can compute it,
    nobody else can reverse it. Raw ids that a visibility query cannot match (quotes, backslashes,
    control characters; measured on the dev server) or that are too long for a Keyword fall back
    to the plain hash key; `mnemoflow user-key USER` prints the value either way.
    """
    if secret:
        return "u-" + hmac.new(secret, user_id.encode("utf-8"), hashlib.sha256).hexdigest()[:32]
    if (
        len(user_id.encode("utf-8")) > MAX_SEARCH_USER_BYTES
        or _UNQUERYABLE.search(user_id)
        or user_id.startswith(_HASHED)  # a raw id may not pass for another id's hash
    ):
        return _HASHED + user_key(user_id)
    return user_id


def resolve_user_keys(
    secret: str | bytes | None,
    pseudonymous: bool | None,
    *,
    encrypted: bool,
    refuse_unused_secret: bool = True,
) -> bytes | None:
    """The pseudonymous-key secret, or None for readable user keys: the one rule every client,
    worker and CLI command follows (`Settings.user_key_secret` calls it), so a user's workflow
    id never depends on how a client was built.

    `pseudonymous` None means on when payloads are encrypted; on without a secret is refused
    (ValueError) rather than falling back to the raw-id workflow, which a forget by an
    operator with the secret would not reach (docs/PRIVACY.md). A secret without encryption
    and without an explicit choice is refused too (a client given one means something by it),
    or ignored with `refuse_unused_secret=False` (the processes' settings: a secret set for
    every process of a deployment without keys has always been unused).
    """
    if isinstance(secret, str):
        secret = secret.encode("utf-8")
    secret = secret or None
    if pseudonymous is None:
        if not encrypted and secret is not None and refuse_unused_secret:
            raise ValueError(
                "a user-key secret (MNEMOFLOW_USER_KEY_SECRET, MemoryClient(user_key_secret=...)) "
                "without encryption keys: set MNEMOFLOW_PSEUDONYMOUS_USER_KEYS=true "
                "(pseudonymous_user_keys=True) to use it, or =false to keep readable workflow "
                "ids (docs/PRIVACY.md)"
            )
        pseudonymous = encrypted
        if pseudonymous and secret is None:
            raise ValueError(
                "encryption keys are configured (the Temporal client has a payload codec), so "
                "user keys are pseudonymous by default: set MNEMOFLOW_USER_KEY_SECRET "
                "(MemoryClient(user_key_secret=...)), or MNEMOFLOW_PSEUDONYMOUS_USER_KEYS=false "
                "(pseudonymous_user_keys=False) to keep readable workflow ids (docs/PRIVACY.md)"
            )
    if not pseudonymous:
        return None
    if secret is None:
        raise ValueError(
            "MNEMOFLOW_PSEUDONYMOUS_USER_KEYS needs MNEMOFLOW_USER_KEY_SECRET "
            "(MemoryClient(user_key_secret=...))"
        )
    return secret


def pseudonymous_workflow_id(user_id: str) -> str:
    """Workflow id without any of the raw user id (for MNEMOFLOW_PSEUDONYMOUS_USER_KEYS)."""
    return f"{USER_WORKFLOW_PREFIX}-{user_key(user_id)}"


#: A user workflow id: the prefix, an optional slug, then the hash key (20 hex characters, or
#: the 32 of a pseudonymous id); a round or other child appends "/..." (slugs never hold "/").
_USER_WORKFLOW = re.compile(
    rf"^{re.escape(USER_WORKFLOW_PREFIX)}-(?:[^/]*-)?([0-9a-f]{{32}}|[0-9a-f]{{20}})(?:/.*)?$"
)
#: Hex characters of the user key that name a user's data key (what every workflow id shares).
DATA_KEY_USER_CHARS = 20


def workflow_user_key(workflow_id: str) -> str | None:
    """The user key (20 hex characters) behind any mnemoflow workflow id of a user, else None.

    Readable (`user_workflow_id`) and pseudonymous (`pseudonymous_workflow_id`) ids of one user,
    and their rounds (`round_workflow_id`), give the same value as `data_key_user(user_id)`:
    the payload codec uses it to pick the user's data key from a workflow id alone.
    """
    match = _USER_WORKFLOW.match(workflow_id)
    return match.group(1)[:DATA_KEY_USER_CHARS] if match else None


def data_key_user(user_id: str) -> str:
    """The user key that names a user's data key (docs/PRIVACY.md, crypto-shredding)."""
    return user_key(user_id)[:DATA_KEY_USER_CHARS]


def data_key_name(prefix: str, data_user: str) -> str:
    """Redis key of the hash holding a user's wrapped data keys (`data_key_user` value)."""
    return f"{prefix}dek:{data_user}"
