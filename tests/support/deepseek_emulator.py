"""A DeepSeek-compatible chat-completions endpoint on 127.0.0.1, scriptable per test.

It answers POST /chat/completions (and /v1/chat/completions) from a queue of scripted replies:

    emulator.push(Reply.tool({"alpha": 0.5, ...}))   # forced tool call with these arguments
    emulator.push(Reply.tool_text("{not json"))       # tool call with broken arguments
    emulator.push(Reply.json_object({...}))           # response_format: json_object answer
    emulator.push(Reply.error(429, retry_after="7"))  # HTTP error, optional Retry-After header

A tool reply names the tool the request forced (tool_choice) or else its first tool, as DeepSeek
does. Every request is recorded (`emulator.requests`), so a test can assert that a client made
exactly one HTTP request per call. Usage mimics DeepSeek's prefix cache: the system prompt is a
cache hit (in 64-token units) once the same system prompt has been seen before, and the reply
carries prompt_cache_hit_tokens / prompt_cache_miss_tokens. With the queue empty it answers 500.

Tests take the `emulator` fixture; `emulator.chat_model()` is a ChatDeepSeek pointed at it, whose
HTTP clients the fixture closes when the test ends.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest_asyncio
from langchain_deepseek import ChatDeepSeek

from mnemoflow.activities.llm.deepseek import close_chat_model, deepseek_chat_model

CACHE_UNIT = 64


def _tokens(text: str) -> int:
    return max(1, int(len(text) / 3.3))


@dataclass
class Reply:
    """One scripted answer."""

    kind: str  # "tool" | "json" | "error"
    body: str = ""
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    tool_name: str | None = None

    @classmethod
    def tool(cls, arguments: dict[str, Any], name: str | None = None) -> Reply:
        """A tool call whose arguments are this JSON object."""
        return cls("tool", json.dumps(arguments, ensure_ascii=False), tool_name=name)

    @classmethod
    def tool_text(cls, arguments: str, name: str | None = None) -> Reply:
        """A tool call with these literal argument bytes (e.g. malformed JSON)."""
        return cls("tool", arguments, tool_name=name)

    @classmethod
    def json_object(cls, content: dict[str, Any]) -> Reply:
        """A plain assistant message whose content is this JSON object."""
        return cls("json", json.dumps(content, ensure_ascii=False))

    @classmethod
    def error(cls, status: int, retry_after: str | None = None, message: str = "") -> Reply:
        """An HTTP error in DeepSeek's error shape."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        body = json.dumps({"error": {"message": message or f"emulated {status}", "type": "x"}})
        return cls("error", body, status=status, headers=headers)


@dataclass
class RecordedRequest:
    """One HTTP request the emulator received."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


class DeepSeekEmulator:
    """The endpoint; use as a context manager (`with DeepSeekEmulator() as emu: emu.base_url`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replies: deque[Reply] = deque()
        self._seen_prefixes: set[str] = set()
        self.requests: list[RecordedRequest] = []
        self._models: list[ChatDeepSeek] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown (once per test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        """Base URL to give the client (it appends /chat/completions)."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def chat_model(self, *, model: str = "deepseek-chat", timeout: float = 5.0) -> ChatDeepSeek:
        """A ChatDeepSeek (client retries off) against this endpoint; see `close_models`."""
        chat = deepseek_chat_model("test-key", base_url=self.base_url, model=model, timeout=timeout)
        self._models.append(chat)
        return chat

    async def close_models(self) -> None:
        """Close the HTTP clients of every model `chat_model` handed out."""
        while self._models:
            await close_chat_model(self._models.pop())

    def push(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Scripted replies not yet used."""
        with self._lock:
            return len(self._replies)

    def __enter__(self) -> DeepSeekEmulator:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def _answer(self, path: str, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(RecordedRequest(path, headers, body))
            return (
                self._replies.popleft() if self._replies else Reply.error(500, message="unscripted")
            )

    def _usage(self, body: dict[str, Any], completion: str) -> dict[str, int]:
        messages = body.get("messages") or []
        system = "".join(str(m.get("content", "")) for m in messages if m.get("role") == "system")
        prompt = _tokens(json.dumps(messages, ensure_ascii=False) + json.dumps(body.get("tools")))
        with self._lock:
            seen = system in self._seen_prefixes
            self._seen_prefixes.add(system)
        hit = min(prompt, (_tokens(system) // CACHE_UNIT) * CACHE_UNIT) if seen else 0
        out = _tokens(completion)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": out,
            "total_tokens": prompt + out,
            "prompt_cache_hit_tokens": hit,
            "prompt_cache_miss_tokens": prompt - hit,
        }

    def _completion(self, reply: Reply, body: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.body}
        finish = "stop"
        if reply.kind == "tool":
            choice = body.get("tool_choice")
            forced = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
            tools = body.get("tools") or [{"function": {"name": "unknown"}}]
            name = reply.tool_name or forced or tools[0]["function"]["name"]
            call = {
                "id": "call_0",
                "type": "function",
                "function": {"name": name, "arguments": reply.body},
            }
            message = {"role": "assistant", "content": "", "tool_calls": [call]}
            finish = "tool_calls"
        return {
            "id": f"emu-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "deepseek-chat"),
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
            "usage": self._usage(body, reply.body),
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: str, headers: dict[str, str]) -> None:
                data = payload.encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") not in ("/chat/completions", "/v1/chat/completions"):
                    self._send(404, json.dumps({"error": {"message": "not found"}}), {})
                    return
                body = json.loads(raw or b"{}")
                reply = emulator._answer(self.path, dict(self.headers.items()), body)
                if reply.kind == "error":
                    self._send(reply.status, reply.body, reply.headers)
                    return
                self._send(200, json.dumps(emulator._completion(reply, body)), {})

        return Handler


@pytest_asyncio.fixture
async def emulator() -> AsyncIterator[DeepSeekEmulator]:
    """A fresh endpoint per test; the models it handed out are closed afterwards."""
    with DeepSeekEmulator() as emu:
        try:
            yield emu
        finally:
            await emu.close_models()
