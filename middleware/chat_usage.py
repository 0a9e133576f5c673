"""The main chat model's token usage: read from its responses, counted for Prometheus in the
agent process, and carried to the user's cost ledger with the next hand-over.

Injecting memory makes every chat call longer, so the chat tokens are the other half of what
memory costs. Per user they go to the ledger of the user workflow (a label per user would make
Prometheus series grow with the user count); the Prometheus counters are per process, by kind.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from prometheus_client import CollectorRegistry, Counter

from mnemoflow.models.usage import LLMUsage

#: Per-(user, thread) usage waiting for a hand-over is kept for at most this many keys.
MAX_PENDING_KEYS = 10_000


def message_usage(message: BaseMessage) -> LLMUsage | None:
    """What one AI message says it cost (LangChain's `usage_metadata`), or None."""
    meta: Mapping[str, Any] | None = getattr(message, "usage_metadata", None)
    if not isinstance(message, AIMessage) or not meta:
        return None
    details = meta.get("input_token_details") or {}
    tokens_in = int(meta.get("input_tokens") or 0)
    hit = int(details.get("cache_read") or 0)
    return LLMUsage(
        calls=1,
        input_tokens=tokens_in,
        output_tokens=int(meta.get("output_tokens") or 0),
        cache_hit_tokens=hit,
        cache_miss_tokens=max(0, tokens_in - hit) if hit else 0,
    )


def response_usage(response: Any) -> LLMUsage | None:
    """The usage of a model call's result (ModelResponse, ExtendedModelResponse or AIMessage);
    None when the model reported none."""
    inner = getattr(response, "model_response", response)
    messages: Iterable[Any] = getattr(inner, "result", None) or [inner]
    total: LLMUsage | None = None
    for message in messages:
        usage = message_usage(message) if isinstance(message, BaseMessage) else None
        if usage is not None:
            total = usage if total is None else total + usage
    return total


class ChatTokenMetrics:
    """`mnemoflow_chat_tokens_total{kind}` and `mnemoflow_chat_calls_total` in one registry.

    By default a registry of its own (serve it with prometheus_client's `make_asgi_app` or
    `start_http_server(port, registry=...)`); pass the application's registry to add them to
    its page. A registry takes these names once: share one instance between middlewares.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.tokens = Counter(
            "mnemoflow_chat_tokens",
            "Main chat model tokens reported by its responses, by kind (input, output, cache_hit).",
            ["kind"],
            registry=self.registry,
        )
        self.calls = Counter(
            "mnemoflow_chat_calls",
            "Main chat model calls whose response reported token usage.",
            registry=self.registry,
        )

    def record(self, usage: LLMUsage) -> None:
        """Count one call's usage."""
        self.calls.inc(usage.calls)
        for kind, tokens in (
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
            ("cache_hit", usage.cache_hit_tokens),
        ):
            if tokens:
                self.tokens.labels(kind=kind).inc(tokens)


class PendingUsage:
    """Chat usage per (user, thread) not yet accepted with a hand-over (bounded, oldest out)."""

    def __init__(self, limit: int = MAX_PENDING_KEYS) -> None:
        self._pending: OrderedDict[tuple[str, str], LLMUsage] = OrderedDict()
        self._limit = limit

    def add(self, key: tuple[str, str], usage: LLMUsage | None) -> None:
        """Add usage (None is nothing) to what the key's next hand-over carries."""
        if usage is None:
            return
        self._pending[key] = self._pending.get(key, LLMUsage()) + usage
        self._pending.move_to_end(key)
        while len(self._pending) > self._limit:
            self._pending.popitem(last=False)

    def take(self, key: tuple[str, str]) -> LLMUsage | None:
        """Everything pending for the key, which the caller now carries (or gives back)."""
        return self._pending.pop(key, None)
