"""Scoring-formula weights, as tuned per theme by an LLM (never trusted: see memory.params)."""

from __future__ import annotations

from pydantic import BaseModel


class TunedParams(BaseModel):
    """S = alpha*R + beta*T + gamma*F + delta; F uses w0 + w1*u + w2*(1 - exp(-k n))."""

    alpha: float = 1 / 3
    beta: float = 1 / 3
    gamma: float = 1 / 3
    delta: float = 0.0
    w0: float = 0.1
    w1: float = 0.8
    w2: float = 0.1
