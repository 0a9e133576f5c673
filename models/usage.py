"""LLM token usage and the per-user cost ledger."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LLMUsage(BaseModel):
    """Tokens of one or more LLM calls, as reported by the provider."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_hit_tokens: int = 0
    cache_miss_tokens: int = 0

    def __add__(self, other: LLMUsage) -> LLMUsage:
        return LLMUsage(
            calls=self.calls + other.calls,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_hit_tokens=self.cache_hit_tokens + other.cache_hit_tokens,
            cache_miss_tokens=self.cache_miss_tokens + other.cache_miss_tokens,
        )


class PriceTable(BaseModel):
    """Prices per 1M tokens (DeepSeek defaults, CNY)."""

    currency: str = "CNY"
    cache_hit_input: float = 0.02
    cache_miss_input: float = 1.0
    output: float = 2.0

    def cost(self, usage: LLMUsage) -> float:
        """Price a usage; input not split by the provider counts as cache miss."""
        hit = usage.cache_hit_tokens
        miss = usage.cache_miss_tokens or max(0, usage.input_tokens - hit)
        total = hit * self.cache_hit_input + miss * self.cache_miss_input
        total += usage.output_tokens * self.output
        return total / 1_000_000


class CostLedger(BaseModel):
    """Usage per memory operation (slice, tune, induct) and its price; and the main chat
    model's tokens as the agent reported them, unpriced (its prices are the application's)."""

    by_operation: dict[str, LLMUsage] = Field(default_factory=dict)
    cost: float = 0.0
    currency: str = "CNY"
    chat: LLMUsage = Field(default_factory=LLMUsage)

    def add(self, operation: str, usage: LLMUsage, prices: PriceTable) -> None:
        """Record one operation's usage."""
        self.by_operation[operation] = self.by_operation.get(operation, LLMUsage()) + usage
        self.cost += prices.cost(usage)
        self.currency = prices.currency

    def total(self) -> LLMUsage:
        """All operations together."""
        out = LLMUsage()
        for usage in self.by_operation.values():
            out = out + usage
        return out
