"""Credentials out of everything printed: URLs are masked before they reach a log or a dump.

Every form of user-info is masked, since which part is the secret depends on the client:
`user:pass@` and `:pass@` keep the user name and mask the password, and a bare `secret@`
(Redis takes `redis://password@host` too) is masked whole. `LogRedactor`, a logging filter the
CLI puts on its handlers, does the same to URLs inside any log line or traceback.
"""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: Parts of a query parameter's name that mark its value as a credential (`?password=`,
#: `?access_token=`, `?api_key=`, `?sig=` ...); redis-py, for one, takes `?password=`.
_SECRET_PARAM = re.compile(r"pass|pwd|token|secret|key|auth|sig|credential", re.IGNORECASE)
_QUERY_ITEM = re.compile(r"([^&;=]*)=([^&;]*)")
MASK = "***"
#: A URL inside free text: scheme, then everything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_TRAILING = ".,;:)]}"


def _masked_netloc(netloc: str) -> str:
    """The netloc with its user-info masked (see the module docstring)."""
    userinfo, at, host = netloc.rpartition("@")
    if not at:
        return netloc
    user, colon, _password = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}@{host}"
    return f"{MASK}@{host}"  # a bare user-info may be the password itself


def mask_url(url: str) -> str:
    """`url` with every credential in it replaced by `***`: its user-info (the password, or
    all of a bare user-info) and the value of any query parameter named like a secret (for
    logs, repr and printouts)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urlsplit can take (e.g. a bad IPv6 host): mask by pattern
        return re.sub(r"(://)[^/?#]*@", rf"\g<1>{MASK}@", url)
    netloc, query = _masked_netloc(parts.netloc), parts.query
    if query:
        query = _QUERY_ITEM.sub(
            lambda m: f"{m[1]}={MASK}" if _SECRET_PARAM.search(m[1]) else m[0], query
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def masked(value: Any) -> Any:
    """`value` with credentials masked if it is a URL string; anything else as it is."""
    return mask_url(value) if isinstance(value, str) and "://" in value else value


def mask_urls_in(text: str) -> str:
    """`text` with every URL in it masked (`mask_url`)."""
    if "://" not in text:
        return text

    def one(match: re.Match[str]) -> str:
        url = match[0].rstrip(_TRAILING)  # sentence punctuation after a URL is not part of it
        return mask_url(url) + match[0][len(url) :]

    return _URL_IN_TEXT.sub(one, text)


class LogRedactor(logging.Filter):
    """Masks URL credentials in a record's message and in its exception text (a library's
    error message or a traceback can quote the URL it was given)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = mask_urls_in(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask_urls_in(record.exc_text)
        return True


def redact_logs(logger: logging.Logger | None = None) -> None:
    """Put a LogRedactor on every handler of `logger` (the root logger by default)."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, LogRedactor) for f in handler.filters):
            handler.addFilter(LogRedactor())
