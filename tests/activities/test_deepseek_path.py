"""The real client path: ChatDeepSeek (retries off) -> emulated DeepSeek on loopback -> activities.

Runs each LLM activity through temporalio's ActivityEnvironment, so `activity.info().attempt`
drives the malformed-output policy exactly as on a worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
from datetime import timedelta

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from mnemoflow.activities.llm.deepseek import deepseek_chat_model
from mnemoflow.activities.llm.langchain_models import LangChainMemoryModels
from mnemoflow.activities.llm_activities import LLMActivities
from mnemoflow.memory.params import renormalise
from mnemoflow.models.contracts import InductInput, SliceInput, TuneInput
from mnemoflow.models.fragments import Fragment
from mnemoflow.models.profile import UserProfile
from mnemoflow.models.turns import ChatTurn
from tests.support.deepseek_emulator import DeepSeekEmulator, Reply

TURNS = [
    ChatTurn(
        thread_id="t",
        position=0,
        role="human",
        content="My order is A-1 and my cat is Mochi.",
        time=1.0,
    ),
    ChatTurn(thread_id="t", position=1, role="ai", content="Noted.", time=2.0),
]
SLICE_ARGS = {
    "fragments": [
        {
            "theme": "orders",
            "types": ["fact"],
            "content": "order A-1",
            "start_idx": 0,
            "end_idx": 0,
        },
        {
            "theme": "pets",
            "types": ["fact", "bogus"],
            "content": "cat Mochi",
            "start_idx": 5,
            "end_idx": -2,
        },
    ]
}
TUNE_ARGS = {"alpha": 2.0, "beta": 1.0, "gamma": 1.0, "delta": 0.5, "w0": 1, "w1": 1, "w2": 2}


class FakeFragments:
    """In-memory fragment reader: the store is not what these tests are about."""

    def __init__(self, fragments: list[Fragment]) -> None:
        self.by_id = {f.id: f for f in fragments}

    async def get(self, user_id: str, ids: list[str]) -> list[Fragment]:
        return [self.by_id[i] for i in ids if i in self.by_id and self.by_id[i].user_id == user_id]


def _fragment(fid: str, content: str) -> Fragment:
    return Fragment(
        id=fid,
        user_id="u1",
        theme="t",
        types=["fact"],
        content=content,
        created_at=0,
        reinforced_at=0,
    )


def _activities(emu: DeepSeekEmulator, fragments: list[Fragment] | None = None) -> LLMActivities:
    model = emu.chat_model(timeout=10)
    return LLMActivities(LangChainMemoryModels(model), FakeFragments(fragments or []))


def _env(attempt: int = 1) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    return env


async def test_slice_parses_clamps_and_reports_deepseek_usage(emulator: DeepSeekEmulator) -> None:
    emulator.push(Reply.tool(SLICE_ARGS), Reply.tool(SLICE_ARGS))
    acts = _activities(emulator)
    first = await _env().run(acts.slice, SliceInput(user_id="u1", turns=TURNS))
    second = await _env().run(acts.slice, SliceInput(user_id="u1", turns=TURNS))

    # The model paraphrased: the turns it did not quote are kept verbatim beside its words.
    assert [d.content for d in first.drafts] == [
        "order A-1\nUser: My order is A-1 and my cat is Mochi.",
        "cat Mochi\nAssistant: Noted.",
    ]
    pets = first.drafts[1]
    assert (pets.start_idx, pets.end_idx, pets.types) == (0, 1, ["fact"])
    assert first.model == "deepseek-chat"
    assert first.usage.calls == 1 and first.usage.input_tokens > 0 and first.usage.output_tokens > 0
    assert first.usage.cache_hit_tokens == 0
    assert first.usage.cache_miss_tokens == first.usage.input_tokens
    # Same system prompt again: the emulated prefix cache serves part of it.
    assert second.usage.cache_hit_tokens > 0
    assert (
        second.usage.cache_hit_tokens + second.usage.cache_miss_tokens == second.usage.input_tokens
    )


async def test_what_the_model_skips_or_paraphrases_is_kept_verbatim(
    emulator: DeepSeekEmulator,
) -> None:
    """A model asked to quote may still paraphrase a turn or leave one out as unimportant:
    every sentence said by the human or the assistant ends up verbatim in some fragment, the
    model's quotes are not repeated, and tool output stays out."""
    said = [
        ("human", "Hi there! My badge number is 7731-B and I start on the night shift Monday."),
        ("ai", "Welcome aboard. Your locker is 14 in the east wing."),
        ("tool", "HR system: record 7731-B updated."),
        ("human", "我女儿叫小雨，今年六岁。她对芒果过敏。"),
        ("human", "Also, my manager is Priya Raman."),
        ("human", "🎂🎉"),  # normalises to nothing: was dropped when the model left it out
    ]
    turns = [
        ChatTurn(thread_id="t", position=i, role=role, content=text, time=float(i))  # type: ignore[arg-type]
        for i, (role, text) in enumerate(said)
    ]
    reply = {
        "fragments": [
            {  # a paraphrase of turn 0, one quote of turn 3, turns 1 and 4 left out
                "theme": "work",
                "types": ["fact"],
                "content": "User starts nights Monday, badge 7731-B.",
                "start_idx": 0,
                "end_idx": 0,
            },
            {
                "theme": "family",
                "types": ["identity"],
                "content": "User: 我女儿叫小雨，今年六岁。",
                "start_idx": 3,
                "end_idx": 3,
            },
        ]
    }
    emulator.push(Reply.tool(reply))
    acts = _activities(emulator)
    out = await _env().run(acts.slice, SliceInput(user_id="u1", turns=turns))
    text = "\n".join(d.content for d in out.drafts)
    for role, sentence in [
        ("User", "Hi there! My badge number is 7731-B and I start on the night shift Monday."),
        ("Assistant", "Welcome aboard. Your locker is 14 in the east wing."),
        ("User", "她对芒果过敏。"),
        ("User", "Also, my manager is Priya Raman."),
        ("User", "🎂🎉"),
    ]:
        assert f"{role}: {sentence}" in text, sentence
    assert text.count("我女儿叫小雨，今年六岁。") == 1  # quoted by the model: not added again
    assert "HR system" not in text
    family = next(d for d in out.drafts if d.theme == "family")
    assert "她对芒果过敏" in family.content  # joined the draft that covers its turn
    assert [(d.start_idx, d.end_idx) for d in out.drafts] == sorted(
        (d.start_idx, d.end_idx) for d in out.drafts
    )


async def test_request_is_one_forced_tool_call_without_history(emulator: DeepSeekEmulator) -> None:
    emulator.push(Reply.tool(SLICE_ARGS))
    await _env().run(_activities(emulator).slice, SliceInput(user_id="u1", turns=TURNS))

    (request,) = emulator.requests
    assert request.path.endswith("/chat/completions")
    assert request.body["tool_choice"]["function"]["name"] == "SliceSchema"
    roles = [m["role"] for m in request.body["messages"]]
    assert roles == ["system", "user"]  # stable system prompt first, no conversation history
    assert "Mochi" in request.body["messages"][1]["content"]


async def test_tune_renormalises_weights(emulator: DeepSeekEmulator) -> None:
    emulator.push(Reply.tool(TUNE_ARGS))
    out = await _env().run(
        _activities(emulator).tune, TuneInput(theme="orders", samples=["order A-1"])
    )

    p = out.params
    assert p.alpha + p.beta + p.gamma == pytest.approx(1.0)
    assert p.w0 + p.w1 + p.w2 == pytest.approx(1.0)
    assert p.alpha == pytest.approx(0.5) and p.w2 == pytest.approx(0.5)
    assert p.delta == pytest.approx(0.2)
    assert out.raw["alpha"] == 2.0  # the raw answer is kept for the scoring log
    assert len(emulator.requests) == 1


async def test_induct_merges_the_models_update(emulator: DeepSeekEmulator) -> None:
    emulator.push(
        Reply.tool(
            {
                "name": "Alice",
                "hobbies": ["swimming", "Swimming"],
                "constraints": ["busy on Wednesdays"],
                "business_fields": {"order_number": "A-1"},
            }
        )
    )
    fragments = [_fragment("f1", "my name is Alice"), _fragment("f2", "order A-1")]
    base = UserProfile(
        occupation="engineer", hobbies=["reading"], business_fields={"card_tail": "4821"}
    )
    acts = _activities(emulator, fragments)
    out = await _env().run(
        acts.induct, InductInput(user_id="u1", profile=base, fragment_ids=["f1", "f2", "gone"])
    )

    assert out.inducted == ["f1", "f2"]
    assert out.profile.name == "Alice" and out.profile.occupation == "engineer"
    assert out.profile.hobbies[0] == "reading"
    assert [h.lower() for h in out.profile.hobbies] == ["reading", "swimming"]  # deduplicated
    assert out.profile.business_fields == {"card_tail": "4821", "order_number": "A-1"}
    assert out.usage.calls == 1
    assert "order A-1" in emulator.requests[0].body["messages"][1]["content"]


async def test_induct_keeps_the_users_fact_beside_someone_elses(
    emulator: DeepSeekEmulator,
) -> None:
    """The model reads facts about the user's family in nearly the user's own words: the merged
    profile keeps the user's facts beside them (it kept only the newest, another person's)."""
    emulator.push(
        Reply.tool(
            {
                "hobbies": ["Son Leo plays the cello"],
                "constraints": ["Wife Priya is allergic to sesame", "我妈妈对猫毛过敏"],
            }
        )
    )
    fragments = [
        _fragment("f1", "User: My son Leo plays the cello."),
        _fragment("f2", "User: My wife Priya is allergic to sesame. 我妈妈对猫毛过敏。"),
    ]
    base = UserProfile(
        hobbies=["Plays the cello"], constraints=["Allergic to sesame", "对猫毛过敏"]
    )
    out = await _env().run(
        _activities(emulator, fragments).induct,
        InductInput(user_id="u1", profile=base, fragment_ids=["f1", "f2"]),
    )
    assert out.profile.hobbies == ["Plays the cello", "Son Leo plays the cello"]
    assert out.profile.constraints == [
        "Allergic to sesame",
        "对猫毛过敏",
        "Wife Priya is allergic to sesame",
        "我妈妈对猫毛过敏",
    ]


@pytest.mark.parametrize(
    "reply",
    [
        Reply.tool_text('{"fragments": [ {"theme": '),  # malformed JSON
        Reply.tool({"items": [1, 2]}),  # wrong schema
        Reply.json_object({"fragments": []}),  # no tool call at all
    ],
    ids=["malformed-json", "wrong-schema", "no-tool-call"],
)
async def test_malformed_output_is_retried_then_the_turns_are_kept_verbatim(
    emulator: DeepSeekEmulator, reply: Reply
) -> None:
    emulator.push(reply, reply)
    acts = _activities(emulator)
    inp = SliceInput(user_id="u1", turns=TURNS)

    with pytest.raises(ApplicationError) as early:
        await _env(attempt=1).run(acts.slice, inp)
    assert not early.value.non_retryable
    assert early.value.type == "MalformedModelOutputRetry"

    # The last attempt gives the model up: the same turns would fail every later round, so
    # they are kept verbatim (the round completes) and the refusal is named.
    last = await _env(attempt=3).run(acts.slice, inp)
    assert last.refused.startswith("MalformedModelOutput:") and "SliceSchema" in last.refused
    kept = " ".join(" ".join(d.content for d in last.drafts).split())
    said = [t for t in TURNS if t.role in ("human", "ai") and t.content.strip()]
    assert said and all(" ".join(t.content.split()) in kept for t in said)
    assert len(emulator.requests) == 2  # one HTTP request per call: the client never retried


async def test_rate_limit_honours_retry_after(emulator: DeepSeekEmulator) -> None:
    emulator.push(Reply.error(429, retry_after="7"))
    with pytest.raises(ApplicationError) as err:
        await _env().run(_activities(emulator).tune, TuneInput(theme="orders"))
    assert err.value.type == "RateLimited" and not err.value.non_retryable
    assert err.value.next_retry_delay == timedelta(seconds=7)
    assert len(emulator.requests) == 1


async def test_server_error_is_retryable_and_not_retried_by_the_client(
    emulator: DeepSeekEmulator,
) -> None:
    emulator.push(Reply.error(500), Reply.error(503))
    with pytest.raises(ApplicationError) as err:
        await _env().run(_activities(emulator).slice, SliceInput(user_id="u1", turns=TURNS))
    assert err.value.type == "ModelUnavailable" and not err.value.non_retryable
    assert len(emulator.requests) == 1
    assert emulator.pending == 1


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "InvalidInput"), (422, "InvalidInput"), (401, "ModelRequestRejected")],
)
async def test_rejected_requests_fail_at_once(
    emulator: DeepSeekEmulator, status: int, kind: str
) -> None:
    """A rejected request is never retried; a refusal of the input (400, 422) gives the theme
    the default weights (named in `refused`), a rejected key (401) fails the activity."""
    emulator.push(Reply.error(status))
    if kind == "InvalidInput":
        out = await _env().run(_activities(emulator).tune, TuneInput(theme="orders"))
        assert out.refused.startswith("InvalidInput:") and f"HTTP {status}" in out.refused
        assert out.params == renormalise({})
    else:
        with pytest.raises(ApplicationError) as err:
            await _env().run(_activities(emulator).tune, TuneInput(theme="orders"))
        assert err.value.type == kind and err.value.non_retryable
    assert len(emulator.requests) == 1


async def test_emulator_answers_json_object_mode(emulator: DeepSeekEmulator) -> None:
    emulator.push(Reply.json_object({"alpha": 0.2, "beta": 0.3, "gamma": 0.5}))
    model = emulator.chat_model(timeout=10)
    runnable = model.with_structured_output(method="json_mode", include_raw=True)
    result = await runnable.ainvoke("Weights as JSON, please.")

    assert result["parsed"] == {"alpha": 0.2, "beta": 0.3, "gamma": 0.5}
    assert emulator.requests[0].body["response_format"] == {"type": "json_object"}


async def test_empty_turns_are_invalid_input_without_a_call(emulator: DeepSeekEmulator) -> None:
    with pytest.raises(ApplicationError) as err:
        await _env().run(_activities(emulator).slice, SliceInput(user_id="u1", turns=[]))
    assert err.value.type == "InvalidInput" and err.value.non_retryable
    assert emulator.requests == []


async def test_a_dropped_model_schedules_nothing_on_the_running_loop() -> None:
    """The SDK's own clients schedule `aclose()` on whatever loop runs when they are collected (in
    a worker, a workflow's loop, which destroys the task); the models we build own plain ones."""
    chat = deepseek_chat_model("test-key", base_url="http://127.0.0.1:9", timeout=1)
    before = asyncio.all_tasks()
    del chat
    gc.collect()
    assert asyncio.all_tasks() == before


async def test_closing_a_model_closes_its_http_clients(emulator: DeepSeekEmulator) -> None:
    chat = emulator.chat_model()
    models = LangChainMemoryModels(chat)
    await models.aclose()
    assert chat.http_async_client.is_closed and chat.http_client.is_closed


async def test_the_models_enrichment_is_indexed_with_the_lines(emulator: DeepSeekEmulator) -> None:
    """With an LLM the slice also gives each fragment's facts, entities and keywords (in the
    words said and in general terms): they reach the line that says them as indexed terms,
    and the line's relative dates are resolved against its turn's time."""
    may_8 = 1683554160.0  # 8 May 2023 13:56 UTC
    turns = [
        ChatTurn(
            thread_id="t",
            position=0,
            role="human",
            time=may_8,
            name="Ana",
            content="Yesterday I went mountaineering with Tomasz.",
        ),
        ChatTurn(thread_id="t", position=1, role="ai", content="Wow, how high?", time=may_8 + 5),
    ]
    args = {
        "fragments": [
            {
                "theme": "outdoors",
                "types": ["episode"],
                "content": "User (Ana): Yesterday I went mountaineering with Tomasz.\n"
                "Assistant: Wow, how high?",
                "start_idx": 0,
                "end_idx": 1,
                "facts": ["Ana went mountaineering with Tomasz on 7 May 2023"],
                "entities": ["Tomasz", "7 May 2023"],
                "keywords": [{"said": "mountaineering", "general": ["outdoor activity", "hiking"]}],
            }
        ]
    }
    emulator.push(Reply.tool(args))
    out = await _env().run(_activities(emulator).slice, SliceInput(user_id="u1", turns=turns))
    (draft,) = out.drafts
    assert draft.entities == ["Tomasz", "7 May 2023"]
    first, second = draft.notes
    assert first.when == "Yesterday = 7 May 2023"
    for term in ("Tomasz", "mountaineering", "outdoor activity", "hiking", "8 May 2023"):
        assert term in first.terms
    assert "Ana went mountaineering with Tomasz on 7 May 2023" in first.terms
    assert second.when == "" and "hiking" not in second.terms
    # the schema the model is forced to answer through asks for the enrichment
    tool = emulator.requests[-1].body["tools"][0]["function"]["parameters"]
    assert {"facts", "entities", "keywords"} <= set(str(tool).split("'"))
