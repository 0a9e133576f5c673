"""Credentials out of everything printed: URLs are masked before they reach a log or a dump."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: Parts of a query parameter's name that mark its value as a credential (`?password=`,
#: `?access_token=`, `?api_key=`, `?sig=` ...); redis-py, for one, takes `?password=`.
_SECRET_PARAM = re.compile(r"pass|pwd|token|secret|key|auth|sig|credential", re.IGNORECASE)
_QUERY_ITEM = re.compile(r"([^&;=]*)=([^&;]*)")


def mask_url(url: str) -> str:
    """`url` with every credential in it replaced by `***`: the password of its user-info and
    the value of any query parameter named like a secret (for logs, repr and printouts)."""
    parts = urlsplit(url)
    netloc, query = parts.netloc, parts.query
    if parts.password is not None:
        user = parts.username or ""
        host = netloc.rpartition("@")[2]
        netloc = f"{user}:***@{host}"
    if query:
        query = _QUERY_ITEM.sub(
            lambda m: f"{m[1]}=***" if _SECRET_PARAM.search(m[1]) else m[0], query
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def masked(value: Any) -> Any:
    """`value` with credentials masked if it is a URL string; anything else as it is."""
    return mask_url(value) if isinstance(value, str) and "://" in value else value
