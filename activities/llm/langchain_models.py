"""LangChainMemoryModels: the three memory calls on any LangChain chat model with tool calling.

Each call is one forced tool call (`with_structured_output(..., method="function_calling")`)
carrying a short, fixed system prompt followed by the input and nothing else. The fixed prompt
comes first so the provider's prefix (KV) cache can serve it across calls and users; no
conversation history is sent, because measured on the predecessor it raised the bill even when it
raised the cache hit rate. Token usage is read from the raw AIMessage, including DeepSeek's
prompt_cache_hit_tokens / prompt_cache_miss_tokens.
"""

from __future__ import annotations

import json
import time
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from pydantic import BaseModel, Field

from mnemoflow.activities.llm.base import InductedProfile, SlicedDrafts, TunedRaw
from mnemoflow.models.errors import MalformedModelOutputError
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from mnemoflow.models.usage import LLMUsage

SLICE_PROMPT = (
    "You split a conversation into themed memory fragments. Each fragment: a short theme, its "
    "types (any of identity, decision, preference, fact, episode, chat), the content, and "
    "start_idx/end_idx, the [index] range of the turns it comes from. The content quotes the "
    "turns that state facts verbatim, one per line as `Speaker: exact words` (never a "
    "paraphrase: names, numbers, dates, places and models exactly as said), by the user and by "
    "the assistant alike; keep each fragment under about 150 words. For each fragment also "
    "give the facts it states (short sentences, names and dates absolute: a turn's time is "
    "given), its entities (people, pets, places, organisations, titles, dates, numbers) and a "
    "few keywords, each in the speaker's words with general terms a later question might use "
    "(mountaineering -> outdoor activity, hiking). "
    "Answer only through the tool."
)
TUNE_PROMPT = (
    "You weight a memory scoring formula S = alpha*R + beta*T + gamma*F + delta for one theme "
    "(R relevance, T recency, F importance = w0 + w1*type_value + w2*reinforcement). "
    "alpha+beta+gamma = 1, w0+w1+w2 = 1, delta in [-0.1, 0.2]. Lasting facts about the person "
    "favour gamma; fleeting chatter favours beta. Answer only through the tool."
)
INDUCT_PROMPT = (
    "You update a user profile from memory fragments. Return only what the fragments state "
    "about the user (leave the rest empty); put concrete identifiers such as order_number, "
    "card_tail, phone_model, birthday, address, favourite_food, free_time, pet_name in "
    "business_fields. Answer only through the tool."
)


class KeywordSchema(BaseModel):
    """A keyword as said, with general terms for it."""

    said: str = Field(description="the keyword in the speaker's words, e.g. 'mountaineering'")
    general: list[str] = Field(
        default_factory=list, description="general terms, e.g. ['outdoor activity', 'hiking']"
    )


class DraftSchema(BaseModel):
    """One memory fragment of the conversation."""

    theme: str = Field(description="short theme, e.g. 'orders & payment'")
    types: list[str] = Field(description="identity, decision, preference, fact, episode, chat")
    content: str = Field(description="verbatim quotes of the turns, `Speaker: exact words`")
    start_idx: int = Field(description="index of the first turn")
    end_idx: int = Field(description="index of the last turn (inclusive)")
    facts: list[str] = Field(default_factory=list, description="facts stated, short sentences")
    entities: list[str] = Field(default_factory=list, description="names, places, dates, numbers")
    keywords: list[KeywordSchema] = Field(default_factory=list, description="at most 8")


class SliceSchema(BaseModel):
    """Themed memory fragments of a conversation."""

    fragments: list[DraftSchema]


class TuneSchema(BaseModel):
    """Weights of the memory scoring formula for one theme."""

    alpha: float = Field(description="weight of relevance")
    beta: float = Field(description="weight of recency")
    gamma: float = Field(description="weight of importance")
    delta: float = Field(description="bias, -0.1..0.2")
    w0: float = Field(description="importance base")
    w1: float = Field(description="importance weight of the type value")
    w2: float = Field(description="importance weight of reinforcement")


class ProfileSchema(BaseModel):
    """What the fragments state about the user."""

    name: str | None = None
    occupation: str | None = None
    style: str | None = Field(None, description="how the user likes to be addressed or answered")
    hobbies: list[str] = Field(default_factory=list)
    interests: list[str] = Field(default_factory=list)
    expertise: list[str] = Field(default_factory=list)
    goals: list[str] = Field(default_factory=list)
    constraints: list[str] = Field(default_factory=list, description="e.g. busy on Wednesdays")
    values: list[str] = Field(default_factory=list)
    relationships: list[str] = Field(default_factory=list, description="people and pets")
    business_fields: dict[str, str] = Field(default_factory=dict)


def usage_of(message: object) -> LLMUsage:
    """Provider-reported usage of one call; DeepSeek's cache split wins over generic fields."""
    usage = LLMUsage(calls=1)
    if not isinstance(message, AIMessage):
        return usage
    meta: dict[str, Any] = dict(message.usage_metadata or {})
    token_usage = (message.response_metadata or {}).get("token_usage") or {}
    usage.input_tokens = int(meta.get("input_tokens") or token_usage.get("prompt_tokens") or 0)
    usage.output_tokens = int(
        meta.get("output_tokens") or token_usage.get("completion_tokens") or 0
    )
    details: dict[str, Any] = dict(meta.get("input_token_details") or {})
    hit = token_usage.get("prompt_cache_hit_tokens", details.get("cache_read"))
    miss = token_usage.get("prompt_cache_miss_tokens")
    usage.cache_hit_tokens = int(hit or 0)
    usage.cache_miss_tokens = int(
        miss if miss is not None else max(0, usage.input_tokens - usage.cache_hit_tokens)
    )
    return usage


def _turn_lines(turns: list[ChatTurn]) -> str:
    return "\n".join(
        f"[{i}] {_stamp(turn.time)} {turn.role}{f' ({turn.name})' if turn.name else ''}: "
        f"{turn.content}"
        for i, turn in enumerate(turns)
    )


def _stamp(at: float) -> str:
    # When it was said, so the model can keep dates ("yesterday" of 8 May 2023 is 7 May).
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(at)) if at > 0 else ""


class LangChainMemoryModels:
    """Memory models backed by a LangChain chat model (one forced tool call per job)."""

    def __init__(self, chat_model: BaseChatModel, name: str | None = None) -> None:
        self.chat_model = chat_model
        self.name = name or str(
            getattr(chat_model, "model_name", None)
            or getattr(chat_model, "model", None)
            or type(chat_model).__name__
        )

    async def aclose(self) -> None:
        """Close the chat model's HTTP clients (call once no activity uses the model)."""
        from mnemoflow.activities.llm.deepseek import close_chat_model

        await close_chat_model(self.chat_model)

    async def _ask(self, schema: type[BaseModel], system: str, user: str) -> tuple[Any, LLMUsage]:
        """One stateless forced tool call; anything but a schema-valid answer is malformed."""
        runnable = self.chat_model.with_structured_output(
            schema, method="function_calling", include_raw=True
        )
        result = await runnable.ainvoke([SystemMessage(system), HumanMessage(user)])
        if not isinstance(result, dict):
            raise MalformedModelOutputError(f"{self.name}: unexpected structured result")
        raw = result.get("raw")
        usage = usage_of(raw)
        if result.get("parsing_error") is not None:
            raise MalformedModelOutputError(
                f"{self.name}: {schema.__name__} answer failed validation: "
                f"{str(result['parsing_error'])[:500]}"
            )
        parsed = result.get("parsed")
        if not isinstance(parsed, schema):
            invalid = getattr(raw, "invalid_tool_calls", None) or []
            reason = (
                f"unparseable tool arguments {str(invalid[0])[:300]}" if invalid else "no tool call"
            )
            raise MalformedModelOutputError(f"{self.name}: {schema.__name__}: {reason}")
        return parsed, usage

    async def slice(self, turns: list[ChatTurn], max_fragments: int) -> SlicedDrafts:
        """Themed fragment drafts (raw: the activity validates and clamps them)."""
        user = f"At most {max_fragments} fragments.\nConversation:\n{_turn_lines(turns)}"
        parsed, usage = await self._ask(SliceSchema, SLICE_PROMPT, user)
        return SlicedDrafts(drafts=[d.model_dump() for d in parsed.fragments], usage=usage)

    async def tune(self, theme: str, samples: list[str], types: list[str]) -> TunedRaw:
        """Raw weights for a theme (the activity renormalises them)."""
        user = json.dumps({"theme": theme, "types": types, "samples": samples}, ensure_ascii=False)
        parsed, usage = await self._ask(TuneSchema, TUNE_PROMPT, user)
        return TunedRaw(params=parsed.model_dump(), usage=usage)

    async def induct(self, profile: UserProfile, fragments: list[Fragment]) -> InductedProfile:
        """A profile update from the fragments (the activity merges it into the profile)."""
        lines = "\n".join(f"- ({f.theme}) {f.content}" for f in fragments)
        known = profile.model_dump_json(exclude_defaults=True)
        user = f"Current profile: {known}\nFragments:\n{lines}"
        parsed, usage = await self._ask(ProfileSchema, INDUCT_PROMPT, user)
        return InductedProfile(update=UserProfile.model_validate(parsed.model_dump()), usage=usage)
