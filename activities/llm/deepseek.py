"""DeepSeek chat model for the memory activities, with the client's own retries switched off.

Temporal's retry policy is the only retry mechanism in mnemoflow: a client that retried on its own
would hide failures from the workflow history and stack its backoff on top of Temporal's.

The model gets HTTP clients of its own, closed by `close_chat_model`. Left to itself the OpenAI SDK
creates a client per model whose finaliser schedules `aclose()` on whatever event loop is running
when the garbage collector happens to reach it; in a worker that can be a workflow's sandboxed
loop, which then destroys the task ("Task was destroyed but it is pending").
"""

from __future__ import annotations

from typing import Any

import openai
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
        http_client=openai.DefaultHttpxClient(timeout=timeout),
        http_async_client=openai.DefaultAsyncHttpxClient(timeout=timeout),
        max_retries=0,
        temperature=0.0,  # memory extraction wants the same answer for the same input
    )


async def close_chat_model(chat: Any) -> None:
    """Close the HTTP clients of an OpenAI-family chat model (a no-op for other models)."""
    async_client = getattr(chat, "http_async_client", None)
    if async_client is not None and hasattr(async_client, "aclose"):
        await async_client.aclose()
    sync_client = getattr(chat, "http_client", None)
    if sync_client is not None and hasattr(sync_client, "close"):
        sync_client.close()
