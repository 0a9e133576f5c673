"""DeepSeek chat model for the memory activities, with the client's own retries switched off.

Temporal's retry policy is the only retry mechanism in mnemoflow: a client that retried on its own
would hide failures from the workflow history and stack its backoff on top of Temporal's.
"""

from __future__ import annotations

from langchain_deepseek import ChatDeepSeek
from pydantic import SecretStr

DEFAULT_BASE_URL = "https://api.deepseek.com"
DEFAULT_MODEL = "deepseek-chat"


def deepseek_chat_model(
    api_key: str | SecretStr,
    base_url: str = DEFAULT_BASE_URL,
    model: str = DEFAULT_MODEL,
    timeout: float = 60.0,
) -> ChatDeepSeek:
    """A ChatDeepSeek with `max_retries=0`, pointed at `base_url` (an emulator in tests)."""
    key = api_key if isinstance(api_key, SecretStr) else SecretStr(api_key)
    return ChatDeepSeek(  # type: ignore[call-arg]  # pydantic alias: model -> model_name
        model=model,
        api_key=key,
        base_url=base_url,
        timeout=timeout,
        max_retries=0,
        temperature=0.0,  # memory extraction wants the same answer for the same input
    )
