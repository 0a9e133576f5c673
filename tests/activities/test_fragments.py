"""Fragment activities end to end through temporalio's ActivityEnvironment, on real Milvus Lite."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from mnemoflow.activities.embeddings import HashingEmbeddings
from mnemoflow.activities.fragment_store import FragmentStore
from mnemoflow.activities.fragments import FragmentActivities, bounded_log
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import (
    DeleteFragmentsInput,
    ForgetLines,
    IndexInput,
    ReinforceInput,
    SelectInput,
)
from mnemoflow.models.fragments import Fragment, LineNote, ScoredCandidate, SelectionLog
from mnemoflow.models.ids import fragment_id, user_key

pytestmark = pytest.mark.integration

NOW = 1_700_000_000.0
USER = 'x" or user_key != "'
TEXTS = [
    ("identity", "name", "My name is Lin Wei"),
    ("preference", "contact", "Prefers email over phone calls"),
    ("fact", "orders", "Order A-1234 was shipped on Monday"),
    ("fact", "orders", "Order B-777 is waiting for payment"),
    ("chat", "weather", "Chatted about the rainy weather"),
    ("episode", "travel", "Went hiking in the mountains last spring"),
]


def fragments(user: str) -> list[Fragment]:
    """The user's six fragments, one per line of TEXTS."""
    return [
        Fragment(
            id=fragment_id(user, 1, i),
            user_id=user,
            theme=theme,
            types=[kind],
            content=text,
            created_at=NOW - 3600,
            reinforced_at=NOW - 3600,
            thread_id="t1",
            start_pos=i,
            end_pos=i + 1,
        )
        for i, (kind, theme, text) in enumerate(TEXTS)
    ]


@pytest.fixture
async def acts(milvus_uri: str, unique_name: str) -> AsyncIterator[FragmentActivities]:
    """Activities over a store with a collection of its own."""
    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    await store.ensure()
    try:
        yield FragmentActivities(store)
    finally:
        await store.drop()
        await store.close()


async def test_index_select_reinforce(acts: FragmentActivities) -> None:
    env = ActivityEnvironment()
    frags = fragments(USER)
    out = await env.run(acts.index, IndexInput(fragments=frags))
    assert out.ids == [f.id for f in frags]
    again = await env.run(acts.index, IndexInput(fragments=frags))  # a retried attempt
    assert again.ids == out.ids
    await env.run(acts.index, IndexInput(fragments=fragments("bob")))

    config = MemoryConfig(top_k=3, published_candidates=5)
    inp = SelectInput(user_id=USER, query="where is my order A-1234", config=config, now=NOW)
    selected = await env.run(acts.select, inp)
    ids = [f.id for f in selected.fragments]
    assert len(ids) == 5 and all(i.startswith(frags[0].id.split("-r")[0]) for i in ids)
    picked = [c.fragment_id for c in selected.log.candidates if c.picked]
    assert len(picked) == 3
    assert set(picked) == set(ids[:3])
    # identity and preference take seats first; the best order match fills the last one.
    assert {frags[0].id, frags[1].id, frags[2].id} == set(picked)
    assert len(selected.log.candidates) == len(frags)  # retrieve_k=None scores them all

    limited = await env.run(acts.select, inp.model_copy(update={"limit": 2}))
    assert [f.id for f in limited.fragments] == ids[:2]

    searched = await env.run(
        acts.select, inp.model_copy(update={"config": config.model_copy(update={"retrieve_k": 4})})
    )
    assert len(searched.log.candidates) == 4

    reinforce = ReinforceInput(user_id=USER, call_id="call-1", fragment_ids=picked, now=NOW)
    assert (await env.run(acts.reinforce, reinforce)).updated == 3
    assert (await env.run(acts.reinforce, reinforce)).updated == 0


async def test_delete_reads_rows_first_and_takes_forgotten_lines_out_of_a_rounds_rows(
    acts: FragmentActivities,
) -> None:
    """`read` hands back rows as stored before anything is deleted; `forget_lines` takes a
    forgotten row's lines out of one round's rows that overlap its span: a row left with none
    is deleted, the others are stored again without them (same id); other rounds' rows, rows
    outside the span and other speakers' equal words stay. `ids=[]` alone deletes nothing
    (what a worker from before these fields does with such a request)."""
    env = ActivityEnvironment()

    def row(n: int, round_no: int, start: int, lines: list[str]) -> Fragment:
        return fragments(USER)[0].model_copy(
            update={
                "id": fragment_id(USER, round_no, n),
                "round_no": round_no,
                "content": "\n".join(lines),
                "start_pos": start,
                "end_pos": start + len(lines),
            }
        )

    forgotten = row(0, 5, 10, ["User (Ann): Dock 4 at noon.", "Assistant: Noted, dock 4."])
    retry = [
        row(0, 6, 9, ["User (Ann): Parcel 12 is late.", "Assistant: Noted, dock 4."]),
        # the same words said again, a second turn: each forgotten line goes once, from the
        # row nearest the forgotten row's place
        row(1, 6, 11, ["User (Ann): Dock 4 at noon.", "User (Ann): Parcel 12 is late."]),
        row(2, 6, 13, ["User (Ann): Dock 4 at noon."]),  # outside the span: stays
        row(3, 6, 10, ["User (Ann): Dock 4 at noon."]),  # quoted whole: deleted
        row(4, 6, 10, ["Assistant: Dock 4 at noon."]),  # another speaker: stays
    ]
    other = row(0, 7, 10, ["User (Ann): Dock 4 at noon."])  # another round: stays
    await env.run(acts.index, IndexInput(fragments=[forgotten, *retry, other]))
    read = await env.run(
        acts.delete_fragments,
        DeleteFragmentsInput(user_id=USER, ids=[], read=[forgotten.id, "never-stored"]),
    )
    assert read.deleted == 0 and [r.content for r in read.rows] == [forgotten.content]
    assert (read.rows[0].round_no, read.rows[0].start_pos, read.rows[0].end_pos) == (5, 10, 12)
    assert await acts.store.count(USER) == 7
    spec = ForgetLines(round_no=6, start_pos=10, end_pos=12, content=forgotten.content)
    out = await env.run(
        acts.delete_fragments, DeleteFragmentsInput(user_id=USER, ids=[], forget_lines=spec)
    )
    assert out.deleted_ids == [retry[3].id] and out.deleted == 1
    assert {f.id: f.content for f in out.rewritten} == {
        retry[0].id: "User (Ann): Parcel 12 is late.",
    }
    stored = {f.id: f.content for f in await acts.store.all_for_user(USER)}
    assert stored == {
        forgotten.id: forgotten.content,
        retry[0].id: "User (Ann): Parcel 12 is late.",
        retry[1].id: retry[1].content,
        retry[2].id: retry[2].content,
        retry[4].id: retry[4].content,
        other.id: other.content,
    }


async def test_a_row_rewritten_without_forgotten_lines_keeps_no_terms_of_them(
    acts: FragmentActivities,
) -> None:
    """The notes a row is indexed with may hold a forgotten line's words (its fragment's
    facts and keywords): a row stored again without forgotten lines keeps, per line left,
    only the dates its own words name; a row cut by quotes keeps no notes."""
    env = ActivityEnvironment()
    kept_line, gone_line = "User (Ann): We met yesterday.", "User (Ann): My PIN is 4471."
    notes = [
        LineNote(when="yesterday = 7 May 2023", terms="8 May 2023 | PIN 4471 | Ann"),
        LineNote(terms="PIN 4471 | Ann's PIN is 4471"),
    ]
    stored = fragments(USER)[0].model_copy(
        update={
            "id": fragment_id(USER, 6, 0),
            "round_no": 6,
            "content": f"{kept_line}\n{gone_line}",
            "start_pos": 10,
            "end_pos": 12,
            "notes": notes,
        }
    )
    await env.run(acts.index, IndexInput(fragments=[stored]))
    spec = ForgetLines(round_no=6, start_pos=10, end_pos=12, content=gone_line)
    out = await env.run(
        acts.delete_fragments, DeleteFragmentsInput(user_id=USER, ids=[], forget_lines=spec)
    )
    assert [f.content for f in out.rewritten] == [kept_line]
    (row,) = await acts.store.all_for_user(USER)
    assert row.content == kept_line
    assert row.notes == [LineNote(when="yesterday = 7 May 2023")]


async def test_permanent_problems_are_non_retryable(acts: FragmentActivities) -> None:
    env = ActivityEnvironment()
    with pytest.raises(ApplicationError) as bad_user:
        await env.run(acts.select, SelectInput(user_id="", query="q", now=NOW))
    assert bad_user.value.type == "InvalidInput" and bad_user.value.non_retryable

    broken = fragments(USER)[0].model_copy(update={"id": 'id" or 1==1'})
    with pytest.raises(ApplicationError) as bad_id:
        await env.run(acts.index, IndexInput(fragments=[broken]))
    assert bad_id.value.type == "InvalidInput" and bad_id.value.non_retryable

    with pytest.raises(ApplicationError) as bad_reinforce:
        await env.run(
            acts.reinforce, ReinforceInput(user_id="a\x00", call_id="c", fragment_ids=[], now=NOW)
        )
    assert bad_reinforce.value.non_retryable


async def test_select_for_a_user_without_fragments(acts: FragmentActivities) -> None:
    out = await ActivityEnvironment().run(
        acts.select, SelectInput(user_id="nobody", query="anything", now=NOW)
    )
    assert out.fragments == [] and out.log.candidates == []


def test_bounded_log_keeps_the_best_and_every_picked_line() -> None:
    def line(i: int, picked: bool) -> ScoredCandidate:
        return ScoredCandidate(
            fragment_id=f"f{i}",
            theme="t",
            types=[],
            cos=0,
            R=0,
            T=0,
            F=0,
            alpha_R=0,
            beta_T=0,
            gamma_F=0,
            delta=0,
            score=-i,
            picked=picked,
        )

    log = SelectionLog(
        at=NOW,
        theme="t",
        params_source="default",
        candidates=[line(i, i in (0, 900)) for i in range(1000)],
    )
    kept = bounded_log(log, limit=10).candidates
    assert [c.fragment_id for c in kept] == [f"f{i}" for i in range(10)] + ["f900"]


async def test_index_and_delete_move_the_version_after_milvus_and_copy_nothing_to_redis(
    milvus_uri: str, redis_url: str, unique_name: str
) -> None:
    """Every write and delete moves the user's corpus version, after Milvus changed (a search
    that read the rows before reads as older); the lines go with their fragment; Redis holds
    no fragment at any step."""
    import redis.asyncio as aioredis

    from mnemoflow.activities.search_corpus import SearchCorpus
    from mnemoflow.models.corpus import corpus_version_key

    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name, lines=True)
    await store.ensure()
    prefix = f"{unique_name}:"
    redis = aioredis.Redis.from_url(redis_url)
    corpus = SearchCorpus(redis, prefix)
    acts = FragmentActivities(store, corpus)
    env = ActivityEnvironment()
    vkey = corpus_version_key(prefix, USER)
    versions: list[int] = []

    async def moved() -> None:
        versions.append(int(await redis.get(vkey) or 0))
        assert versions[-1] > (versions[-2] if len(versions) > 1 else 0), versions
        keys = {k.decode() async for k in redis.scan_iter(match=f"{prefix}*")}
        assert keys == {vkey}, keys  # nothing but the version

    try:
        frags = fragments(USER)
        await env.run(acts.index, IndexInput(fragments=frags))
        await moved()
        lines = await store._lines_left(user_key(USER), None)
        assert lines >= len(frags)

        deleting = store.delete

        async def checked_delete(user_id: str, ids: list[str]) -> int:
            before = int(await redis.get(vkey) or 0)
            done = await deleting(user_id, ids)
            assert int(await redis.get(vkey) or 0) == before, "version moved before the delete"
            return done

        store.delete = checked_delete  # type: ignore[method-assign]
        await env.run(acts.delete_fragments, DeleteFragmentsInput(user_id=USER, ids=[frags[0].id]))
        await moved()
        assert await store._lines_left(user_key(USER), [frags[0].id]) == 0
        assert await store._lines_left(user_key(USER), None) < lines

        await env.run(acts.delete_fragments, DeleteFragmentsInput(user_id=USER, ids=None))
        assert not await redis.exists(vkey)  # forgetting the user drops the version
        assert await store._lines_left(user_key(USER), None) == 0
    finally:
        await redis.aclose()
        await store.drop()
        name = store.lines_collection
        assert name is not None
        await store._run_write(lambda c: c.drop_collection(name))
        await store.close()


async def _round(
    user: str, round_no: int, conversation: list[tuple[str, str]], at: float = NOW
) -> list[Fragment]:
    """The heuristic slicer's fragments of one round said at `at`, as the round workflow builds
    them."""
    from mnemoflow.activities.llm.base import validate_drafts
    from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
    from mnemoflow.models.contracts import RoundInput
    from mnemoflow.models.turns import ChatTurn
    from mnemoflow.workflows.memory_round import build_fragments

    turns = [
        ChatTurn(thread_id=f"t{round_no}", position=i, role=role, content=text, time=at + i)  # type: ignore[arg-type]
        for i, (role, text) in enumerate(conversation)
    ]
    drafts = validate_drafts((await HeuristicMemoryModels().slice(turns, 8)).drafts, len(turns), 8)
    inp = RoundInput.model_construct(
        user_id=user,
        round_no=round_no,
        thread_id=f"t{round_no}",
        turns=turns,
        event_id=f"e{round_no}",
        first_seq=0,
    )
    return build_fragments(inp, drafts, at + 100)


# Held-out facts (not the demo's) told in a first session, then sessions that only ask about them
# and get them read back: those store nothing. A later session repeating a fact with something new
# is stored.
TOLD = [
    ("human", "I'm allergic to shellfish, so no prawns for me."),
    ("ai", "Noted, no shellfish."),
    ("human", "My library card number is LB-30917, the branch is on Cross Street."),
    ("human", "我对芒果过敏，吃了会起疹子。"),
    ("human", "我儿子叫豆豆，今年五岁，在读幼儿园。"),
]
RECALLS = [
    [
        ("human", "What am I allergic to?"),
        ("ai", "From what I have: you are allergic to shellfish."),
    ],
    [
        ("human", "Remind me what my library card number is"),
        ("ai", "Your library card number is LB-30917."),
    ],
    [("human", "我对什么过敏？"), ("ai", "根据之前的记录，您对芒果过敏。")],
    [("human", "你还记得我儿子叫什么名字吗"), ("ai", "记得，您儿子叫豆豆。")],
    # asked, and the reply states nothing: no fact either, whatever was asked about
    [("human", "When did I last renew my passport?"), ("ai", "Let me check my notes.")],
]
NEWS = [
    ("human", "What am I allergic to?"),
    ("ai", "You are allergic to shellfish."),
    ("human", "Also my doctor found I'm allergic to penicillin since March, which is new."),
]


async def test_recall_only_turns_and_repeats_are_not_stored(acts: FragmentActivities) -> None:
    env = ActivityEnvironment()
    user = "held-out-user"
    told = await _round(user, 1, TOLD)
    assert (await env.run(acts.index, IndexInput(fragments=told))).ids == [f.id for f in told]
    for n, recall in enumerate(RECALLS, start=2):
        frags = await _round(user, n, recall)
        assert frags
        assert (await env.run(acts.index, IndexInput(fragments=frags))).ids == [], recall
    stored = await acts.store.all_for_user(user)
    assert sorted(f.id for f in stored) == sorted(f.id for f in told)
    # The same fact told again in the same words adds nothing either (a short line is never
    # judged: too few words); told in other words it is kept (a paraphrase may change a detail).
    again = await _round(
        user,
        10,
        [("human", "My library card number is LB-30917, the branch is on Cross Street.")],
    )
    assert (await env.run(acts.index, IndexInput(fragments=again))).ids == []
    other_words = await _round(
        user,
        13,
        [("human", "Again: my library card number is LB-30917, the branch is on Cross St.")],
    )
    kept = await env.run(acts.index, IndexInput(fragments=other_words))
    assert kept.ids == [f.id for f in other_words]
    short = await _round(user, 12, [("human", "I'm allergic to shellfish.")])
    assert (await env.run(acts.index, IndexInput(fragments=short))).ids == [short[0].id]
    # ... but a session that asks and then tells something new is kept whole.
    news = await _round(user, 11, NEWS)
    written = await env.run(acts.index, IndexInput(fragments=news))
    assert written.ids and "penicillin" in " ".join(f.content for f in news)
    # A retried index of a round compares with other rounds only: it writes the same rows.
    assert (await env.run(acts.index, IndexInput(fragments=news))).ids == written.ids
    assert (await env.run(acts.index, IndexInput(fragments=told))).ids == [f.id for f in told]


def _frag(fid: str, content: str, round_no: int, user_id: str = "u") -> Fragment:
    """A stored fragment of `user_id` said in round `round_no`."""
    return Fragment(
        id=fid,
        user_id=user_id,
        theme="t",
        types=["fact"],
        content=content,
        created_at=1,
        reinforced_at=1,
        round_no=round_no,
    )


def test_asks_only_and_restates() -> None:
    from mnemoflow.activities.fragments import asks_only, new_information, replies
    from mnemoflow.memory.text import fact_tokens, restates

    assert asks_only("User (Ann): Where do I live?\nAssistant: In Leeds.")
    assert asks_only("User: 告诉我我的借书证号\nAssistant: LB-30917")
    assert not asks_only("User: Where do I live? I forgot.\nAssistant: In Leeds.")
    assert not asks_only("Assistant: In Leeds.")  # no human side: nothing was asked
    assert replies("User (Ann): Where?\nAssistant: In Leeds.\nmore") == "Assistant: In Leeds.\nmore"
    fact = fact_tokens("User: I live in Leeds, on Cross Street, with two cats and a dog.")
    assert restates(fact_tokens("User: Where do I live?\nAssistant: In Leeds."), fact, True)
    assert not restates(fact_tokens("User: Where do I live?\nAssistant: In York."), fact, True)
    # A short statement is never judged a repeat: few words are shared by chance.
    assert not restates(fact_tokens("User: I live in Leeds."), fact, False)
    told = "User: I live in Leeds, on Cross Street, with two cats and a dog called Rex."
    a = Fragment(
        id="a", user_id="u", theme="t", types=["fact"], content=told, created_at=1, reinforced_at=1
    )
    asked = a.model_copy(update={"id": "b", "content": "User: Where do I live?\nAssistant: Leeds."})
    assert new_information([asked.model_copy(update={"round_no": 2})], [a]) == []
    # the same round's rows are never compared with (a retried index writes them again)
    assert new_information([asked], [a]) == [asked]


def test_a_recall_turn_reading_back_several_fragments_adds_nothing() -> None:
    """Two questions answered from two earlier fragments: nothing new, so not stored; the same
    turn with a fact no earlier fragment holds is kept."""
    from mnemoflow.activities.fragments import new_information

    earlier = [
        _frag("home", "User: I live in Leeds, on Cross Street, with two cats.", 1),
        _frag("food", "User: My favourite food is pad thai, extra spicy please.", 2),
        _frag("job", "User: I work night shifts as a nurse at the city hospital.", 3),
    ]
    recall = _frag(
        "r",
        "User: Where do I live?\nAssistant: On Cross Street in Leeds.\n"
        "User: And my favourite food?\nAssistant: Pad thai, extra spicy.",
        9,
    )
    assert new_information([recall], earlier) == []
    news = recall.model_copy(
        update={"content": recall.content + "\nAssistant: Your parcel ships to Glasgow Friday."}
    )
    assert new_information([news], earlier) == [news]
    # A fragment cut between a question and its answer holds only the answer: judged the same.
    answer_only = recall.model_copy(
        update={"content": "Assistant: You live on Cross Street in Leeds, with two cats."}
    )
    assert new_information([answer_only], earlier) == []
    told = answer_only.model_copy(update={"content": "Assistant: I moved to Bristol in May."})
    assert new_information([told], earlier) == [told]


def test_an_update_that_changes_one_detail_is_stored() -> None:
    """A statement that repeats most of an earlier fragment but changes a detail is an update,
    not a repeat: a new number, a new word on the human side, in English and in Chinese, with
    or without speaker labels; the same statement repeated stays out. A recall turn whose
    reply carries a number memory does not hold is stored too."""
    from mnemoflow.activities.fragments import new_information

    home = "I live at 12 Elm Street in Springfield with my wife Anna and our dog Max."
    allergies = "I'm allergic to peanuts, shellfish and penicillin; my sister Jane nurses in Leeds."
    zh = "我住在北京朝阳区建国路12号，和妻子安娜还有我们的狗一起。"
    order = "User: Where is my order?\nAssistant: Order 4521, the blue kettle, ships by DHL on "
    earlier = [
        _frag("home", f"User: {home}\nAssistant: Got it, 12 Elm Street with Anna and Max.", 1),
        _frag("allergies", f"User: {allergies}", 2),
        _frag("zh", f"User: {zh}", 3),
        _frag("order", order + "Tuesday, tracking 88230.", 4),
    ]
    updates = [
        _frag("moved", "User: We moved! " + home.replace("12", "14"), 9),
        _frag("dairy", "User: " + allergies.replace("shellfish", "shellfish, dairy"), 9),
        _frag("unlabelled", allergies.replace("peanuts", "peanuts, kiwi"), 9),
        _frag("zh-moved", "User: " + zh.replace("12", "14"), 9),
        _frag("zh-husband", "User: " + zh.replace("妻子", "丈夫"), 9),
        _frag("tracking", order + "Tuesday, tracking 88231.", 9),
        # the words a bag of content words misses: a month that is a modal verb, who it is
        # about, the tense, the order, a decimal, a short form, an emoji
        _frag("may", "User: " + home + " We marry in May.", 9),
        _frag("who", "User: " + allergies.replace("I'm", "My wife is"), 9),
        _frag("tense", "User: " + home.replace("I live", "I lived"), 9),
        _frag("order", "User: " + home.replace("Anna and our dog Max", "Max and our dog Anna"), 9),
        _frag(
            "dose", "User: I take 3.5 mg of warfarin every morning with breakfast and water.", 11
        ),
        _frag("short", "User: " + home.replace("Anna", "Ann"), 9),
        _frag("emoji", "User: " + home + " My favourite fruit is 🍌.", 12),
    ]
    earlier += [
        _frag("weds", "User: " + home + " We marry in June.", 5),
        _frag(
            "warfarin", "User: I take 5 mg of warfarin every morning with breakfast and water.", 6
        ),
        _frag("fruit", "User: " + home + " My favourite fruit is 🍓.", 7),
    ]
    for update in updates:
        assert new_information([update], earlier) == [update], update.id
    repeats = [
        _frag("home-again", f"User: {home}", 9),
        _frag("zh-again", f"User: {zh}", 9),
        _frag("order-again", order + "Tuesday, tracking 88230.", 9),
    ]
    for repeat in repeats:
        assert new_information([repeat], earlier) == [], repeat.id


# Questions that tell something on their way (kept), and questions that only ask (not kept),
# in English and Chinese; none of them the demo's words.
TOLD_IN_QUESTIONS = [
    "Since I moved to Berlin where does my sister live?",
    "Where does my sister live, now that I live in Berlin?",
    "Just moved to Berlin, where does my sister live?",
    "New job at Google starting March 3, where does my sister live?",
    "I got a puppy named Bruno and where does my sister live?",
    "How do I cook for my son Leo who is allergic to eggs?",
    "Remind me where my sister lives, my doctor just put me on a low-salt diet?",
    "Tell me where my sister lives since I am pregnant now",
    "Could you remember that my locker code is 4471?",
    "Can you remember my gate code 8812",
    "我上个月搬到了柏林，我姐姐住在哪里？",
    "我怀孕了吃什么好？",
    "我下周三去东京出差要带什么？",
    "我有没有说过我下个月搬去成都",
]
ONLY_ASKING = [
    "Where does my sister live?",
    "Hi, where does my sister live?",
    "And my sister?",
    "Before I forget, where does my sister live?",
    "Can you remember my sister's name?",
    "Do you remember what my locker code is?",
    "What should I do if I lose my card?",
    "Where does my sister live, and what does she do?",
    "What did Jane and her husband do at the hospital?",
    # about someone else, placed in time: a name or a date in it is no news
    "What did Omar and his twins bake for the fair in March 2024?",
    "Which hobby did Lena pick up lately, as she said on 4 May, 2024?",
    "Around which US holiday did Omar fly to Denver?",
    "我姐姐住在哪里？",
    "你还记得我姐姐住在哪里吗",
    "我明天有没有空",
    "我是不是对花生过敏",
]


def test_a_fact_told_inside_a_question_is_stored() -> None:
    """A question that tells something new on its way is not a recall turn, even when the reply
    only reads memory back or says nothing yet; a question that only asks adds nothing."""
    from mnemoflow.activities.fragments import asks_only, new_information

    earlier = Fragment(
        id="a",
        user_id="u",
        theme="t",
        types=["fact"],
        round_no=1,
        created_at=1,
        reinforced_at=1,
        content="User: My sister Jane lives in Leeds and works as a nurse at the city hospital.",
    )
    for reply in (
        "\nAssistant: Your sister Jane lives in Leeds, a nurse.",
        "\nAssistant: Sure.",
        "",
    ):
        for question in TOLD_IN_QUESTIONS:
            turn = earlier.model_copy(
                update={"id": "b", "round_no": 2, "content": f"User: {question}{reply}"}
            )
            assert not asks_only(turn.content), question
            assert new_information([turn], [earlier]) == [turn], (question, reply)
            # with nothing stored before, too
            assert new_information([turn], []) == [turn], (question, reply)
        for question in ONLY_ASKING:
            turn = earlier.model_copy(
                update={"id": "c", "round_no": 2, "content": f"User: {question}{reply}"}
            )
            assert asks_only(turn.content), question
            assert new_information([turn], [earlier]) == [], (question, reply)


def test_statements_with_question_words_and_other_filter_edges() -> None:
    """Chinese statements with an indefinite question word (不怎么, 什么都) are statements; a
    speaker name with brackets keeps its line the human's; an explicit remember is never
    filtered; a fragment is compared with its own user's fragments only."""
    from mnemoflow.activities.fragments import asks_only, new_information
    from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
    from mnemoflow.activities.llm.heuristic_rules import is_question
    from mnemoflow.models.turns import ChatTurn

    for statement in (
        "我不怎么喝酒",
        "我什么都吃，就是不吃香菜",
        "我没什么爱好",
        "我怎么也想不起来",
    ):
        assert not is_question(statement), statement
    for question in ("我明天有没有空", "你喜不喜欢猫", "我是否对青霉素过敏", "我对什么过敏"):
        assert is_question(question), question

    turn = ChatTurn(
        thread_id="t",
        position=0,
        role="human",
        content="I am allergic to cashews and kiwi.",
        time=1.0,
        name="Jamie (she/her)",
    )
    drafts = asyncio.run(HeuristicMemoryModels().slice([turn], 8)).drafts
    assert drafts[0]["content"].startswith("User (Jamie [she/her]): I am allergic")
    assert not asks_only(drafts[0]["content"])

    said = "User: I live at 12 Elm Street in Leeds with my wife Sara and two cats, Milo and Luna."
    alice = Fragment(
        id="a",
        user_id="alice",
        theme="t",
        types=["fact"],
        round_no=1,
        created_at=1,
        reinforced_at=1,
        content=said,
    )
    bob = alice.model_copy(update={"id": "b", "user_id": "bob", "round_no": 2})
    assert new_information([bob], [alice]) == [bob]
    assert new_information([alice.model_copy(update={"id": "c", "round_no": 2})], [alice]) == []
    explicit = alice.model_copy(update={"id": "d", "round_no": 3, "explicit": True})
    assert new_information([explicit], [alice]) == [explicit]


def test_a_negated_fact_is_not_a_repeat() -> None:
    """ "not" (also in "don't", "can't") is kept as a word of its own: a statement that negates an
    earlier one is stored ("note" stems to "not", and the words of reading back were once
    taken out with it); a reply that only says memory lacks something stays out."""
    from mnemoflow.activities.fragments import new_information
    from mnemoflow.memory.text import fact_tokens

    said = "I am vegan, I live in Leeds with my wife Anna and two cats, and I work as a nurse."
    earlier = Fragment(
        id="a",
        user_id="u",
        theme="t",
        types=["fact"],
        content=f"User: {said}",
        created_at=1,
        reinforced_at=1,
        round_no=1,
    )
    for negated in (
        said.replace("I am vegan", "I am not vegan"),
        said.replace("I live", "I don't live"),
        said.replace("I work", "I can't work"),
        said.replace("I am vegan", "I am never vegan"),
    ):
        update = earlier.model_copy(
            update={"id": "b", "round_no": 2, "content": f"User: {negated}"}
        )
        assert new_information([update], [earlier]) == [update], negated
    repeat = earlier.model_copy(update={"id": "c", "round_no": 2})
    assert new_information([repeat], [earlier]) == []
    nothing = earlier.model_copy(
        update={
            "id": "d",
            "round_no": 2,
            "content": "User: Do I have pets?\nAssistant: No, you haven't said.",
        }
    )
    assert new_information([nothing], [earlier]) == []
    assert fact_tokens("Assistant: I will check my notes.") == set()
    assert "not" in fact_tokens("User: I'm not vegan") and "not" in fact_tokens(
        "User: I can't swim"
    )


def _store_step(user: str, frags: list[Fragment], version: int) -> Any:
    """A lean round's store step input: these fragments, a selection for "allergic"."""
    from mnemoflow.models.contracts import InjectedContext
    from mnemoflow.models.round_store import StoreRoundInput

    return StoreRoundInput(
        fragments=frags,
        select=SelectInput(user_id=user, query="allergic", config=MemoryConfig(), now=NOW),
        context=InjectedContext(user_id=user, version=version, generated_at=NOW),
    )


async def test_the_lean_round_store_step_skips_recall_only_turns_too(
    milvus_uri: str, redis_url: str, unique_name: str
) -> None:
    """Rounds of the lean shape store through `store_round`, not `index`: the same filter."""
    from mnemoflow.activities.read_model import ReadModel
    from mnemoflow.activities.round_store import RoundStoreActivities

    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    await store.ensure()
    read_model = ReadModel(redis_url, prefix=f"{unique_name}:")
    acts = RoundStoreActivities(store, read_model)
    env = ActivityEnvironment()
    user = "lean-user"

    try:
        told = await _round(user, 1, TOLD)
        first = await env.run(acts.store_round, _store_step(user, told, 1))
        assert first.indexed == [f.id for f in told]
        recall = await _round(user, 2, RECALLS[0])
        assert (await env.run(acts.store_round, _store_step(user, recall, 2))).indexed == []
        assert sorted(f.id for f in await store.all_for_user(user)) == sorted(first.indexed)
    finally:
        await read_model.close()
        await store.drop()
        await store.close()


async def test_the_lean_store_step_never_reads_all_of_a_users_rows_and_moves_the_version(
    milvus_uri: str, redis_url: str, unique_name: str
) -> None:
    """The store step's reads are bounded (the repeat filter reads a round window and
    neighbours, scoring searches the nearest), never the user's whole history; it moves the
    user's corpus version once it has written."""
    import redis.asyncio as aioredis

    from mnemoflow.activities.read_model import ReadModel
    from mnemoflow.activities.round_store import RoundStoreActivities
    from mnemoflow.activities.search_corpus import SearchCorpus
    from mnemoflow.models.corpus import corpus_version_key

    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    await store.ensure()
    prefix = f"{unique_name}:"
    read_model = ReadModel(redis_url, prefix=prefix)
    redis = aioredis.Redis.from_url(redis_url)
    corpus = SearchCorpus(redis, prefix)
    acts = RoundStoreActivities(store, read_model, corpus)
    env = ActivityEnvironment()
    user = "corpus-user"
    reads: list[str] = []
    whole_reads = store._user_rows

    async def counted(key: str, fields: list[str]) -> list[dict]:
        reads.append(key)
        return await whole_reads(key, fields)

    store._user_rows = counted  # type: ignore[method-assign]

    try:
        told = await _round(user, 1, TOLD)
        await env.run(acts.store_round, _store_step(user, told, 1))
        first = int(await redis.get(corpus_version_key(prefix, user)) or 0)
        assert first > 0
        reads.clear()
        more = await _round(user, 2, [("human", "My passport number is X1234567, renewed in May.")])
        await env.run(acts.store_round, _store_step(user, more, 2))
        assert reads == [], reads
        assert int(await redis.get(corpus_version_key(prefix, user)) or 0) > first
    finally:
        await redis.aclose()
        await read_model.close()
        await store.drop()
        await store.close()


# A statement (A), a change of it (B), then A again in the same words: going back to the earlier
# value. The probe's shipping address, then held-out ones in English and Chinese.
REVERTS = [
    (
        "Please ship my orders to my office at 5 Main Street, third floor, reception desk, Leeds.",
        "Please ship my orders to my home at 22 Park Lane, Leeds, from now on.",
    ),
    (
        "My emergency contact is my brother Sam Patel on 07700 900123, he lives in York.",
        "My emergency contact is my neighbour Ruth Cole on 07700 900456 from today.",
    ),
    (
        "I take 5 mg of warfarin every morning with breakfast, as my cardiologist said.",
        "My cardiologist changed it: I take 3 mg of warfarin every evening now.",
    ),
    (
        "For work calls I prefer Microsoft Teams over Zoom, and keep the meetings short please.",
        "For work calls I now prefer Zoom over Microsoft Teams, since our company switched.",
    ),
    (
        "I live at 12 Elm Street, Springfield, with my wife Anna, and I am vegan.",
        "I moved to 14 Elm Street and I am not vegan any more.",
    ),
    (
        "请把我的快递寄到公司，上海市徐汇区漕溪北路88号三楼前台，工作日都有人签收。",
        "以后请把我的快递寄到家里，浦东新区世纪大道100号。",
    ),
    (
        "我每周二和周四晚上去健身房练瑜伽，一般七点开始，练一个半小时。",
        "我现在改成每周六上午去健身房练瑜伽了。",
    ),
]
# A between two tellings of A that is about something else (some share a word with A): the
# second A is still a repeat.
UNRELATED = [
    "I ordered a new kettle from the shop in Leeds yesterday.",
    "My sister Jane just started a new job as a teacher in Glasgow.",
    "我姐姐下个月在杭州结婚，我要去当伴娘。",
    "Leeds, I called it.",
]


async def test_going_back_to_an_earlier_value_is_stored(acts: FragmentActivities) -> None:
    """A, then B changing it, then A again in the same words: the third telling is memory's
    newest word and is stored (the earlier A is superseded by B), though an earlier fragment
    holds it verbatim; telling A a fourth time is a repeat of the third and stays out. Counted
    per round: said (fragments sliced) and stored (ids the index activity wrote)."""
    env = ActivityEnvironment()
    hour = 3600.0
    for k, (first, change) in enumerate(REVERTS):
        user = f"revert-{k}"
        counts = []
        for n, line in enumerate((first, change, first, first), start=1):
            said = await _round(
                user, n, [("human", line), ("ai", "Done, I have noted that.")], NOW + n * hour
            )
            stored = (await env.run(acts.index, IndexInput(fragments=said))).ids
            counts.append((len(said), len(stored)))
        assert [s for s, _ in counts] == [1, 1, 1, 1], (first, counts)
        assert [w for _, w in counts] == [1, 1, 1, 0], (first, counts)
        newest = max(await acts.store.all_for_user(user), key=lambda f: f.created_at)
        assert newest.created_at > NOW + 3 * hour - 1 and first in newest.content


def test_a_repeat_after_something_unrelated_is_still_a_repeat() -> None:
    """Between two tellings of A, fragments about something else (sharing a word with A, or
    stating part of A again) do not supersede A: the second telling adds nothing."""
    from mnemoflow.activities.fragments import new_information

    for k, (first, _) in enumerate(REVERTS[:4] + REVERTS[5:]):
        for other in UNRELATED:
            earlier = [
                _frag(f"a{k}", f"User: {first}\nAssistant: Noted.", 1),
                _frag(f"o{k}", f"User: {other}\nAssistant: Lovely.", 2),
            ]
            again = _frag(f"b{k}", f"User: {first}\nAssistant: Noted.", 3)
            assert new_information([again], earlier) == [], (first, other)
    # a part of A said again later is no change of A
    told = "I live at 12 Elm Street, Springfield, with my wife Anna and our two cats."
    earlier = [
        _frag("home", f"User: {told}", 1),
        _frag("part", "User: I live at 12 Elm Street. The cats are fine.", 2),
    ]
    assert new_information([_frag("again", f"User: {told}", 3)], earlier) == []


PLACES = ["Oslo", "Quito", "Hanoi", "Lagos", "Perth", "Cusco", "Tbilisi", "Galway", "Nara"]
GOODS = ["a kite", "saffron", "a teapot", "wool socks", "a compass", "maps", "honey", "a drum"]


async def _long_history(store: FragmentStore, user: str, first: int, last: int) -> int:
    """One stored fragment per round from `first` to `last`, each saying something else (a
    trip, a purchase and a number no other round has); returns how many."""
    rows = [
        Fragment(
            id=fragment_id(user, n, 0),
            user_id=user,
            theme="travel",
            types=["episode"],
            content=f"User: On trip {n} to {PLACES[n % 9]} I bought {GOODS[n % 8]} for "
            f"{n * 3 + 7} euros.\nAssistant: What a find.",
            created_at=NOW + n * 3600.0,
            reinforced_at=NOW + n * 3600.0,
            round_no=n,
        )
        for n in range(first, last + 1)
    ]
    await store.upsert(rows)
    return len(rows)


async def test_repeats_are_found_past_the_round_window_and_the_read_stays_bounded(
    acts: FragmentActivities,
) -> None:
    """A user with a long history: facts told in the first rounds, read back and told again
    after more than REPEAT_ROUNDS other rounds, are still repeats (the nearest neighbours find
    them); going back to an earlier value is still stored; and the peers read is the round
    window plus the neighbours, not the history. Counted: said against stored per round."""
    from mnemoflow.activities.fragments import REPEAT_NEIGHBOURS, REPEAT_ROUNDS

    env = ActivityEnvironment()
    hour = 3600.0
    late = REPEAT_ROUNDS + 60  # the first rounds are well outside the window by now
    user = "long-history"
    told = await _round(user, 1, TOLD, NOW + hour)
    assert (await env.run(acts.index, IndexInput(fragments=told))).ids == [f.id for f in told]
    filler = await _long_history(acts.store, user, 2, late - 1)
    for n, recall in enumerate(RECALLS[:4], start=late):
        frags = await _round(user, n, recall, NOW + n * hour)
        assert frags
        assert (await env.run(acts.index, IndexInput(fragments=frags))).ids == [], recall
    card = "My library card number is LB-30917, the branch is on Cross Street."
    again = await _round(user, late + 9, [("human", card)], NOW + (late + 9) * hour)
    assert (await env.run(acts.index, IndexInput(fragments=again))).ids == []
    assert len(await acts.store.all_for_user(user)) == len(told) + filler

    probe = await _round(user, late + 10, RECALLS[0], NOW + (late + 10) * hour)
    peers = await acts.store.repeat_peers(
        user, probe, rounds=REPEAT_ROUNDS, neighbours=REPEAT_NEIGHBOURS
    )
    since = late + 10 - REPEAT_ROUNDS
    window = [p for p in peers if p.round_no >= since]
    assert len(window) == late - since  # the filler rounds inside it (the recalls stored none)
    assert len(peers) <= len(window) + REPEAT_NEIGHBOURS * len(probe)
    assert any(p.round_no == 1 for p in peers)  # the told fact, through its neighbours

    for k, (first, change) in enumerate(REVERTS):
        user = f"long-revert-{k}"
        counts = []
        for n, line in [(1, first), (2, change), (late, first), (late + 1, first)]:
            if n == late:
                await _long_history(acts.store, user, 3, late - 1)
            said = await _round(
                user, n, [("human", line), ("ai", "Done, I have noted that.")], NOW + n * hour
            )
            stored = (await env.run(acts.index, IndexInput(fragments=said))).ids
            counts.append((len(said), len(stored)))
        assert counts == [(1, 1), (1, 1), (1, 1), (1, 0)], (first, counts)


async def test_past_retrieve_k_a_far_identity_fragment_keeps_its_seat(
    milvus_uri: str, redis_url: str, unique_name: str
) -> None:
    """A user with more fragments than `retrieve_k`: the round's store step scores only the
    nearest ones, yet the identity fragment (far from the query) still takes its type-floor
    seat, whether the round names the fragments it holds (`known`: published last, its own)
    or not (then a floor search finds it); with no floor types it is not a candidate at all."""
    from mnemoflow.activities.read_model import ReadModel
    from mnemoflow.activities.round_store import RoundStoreActivities
    from mnemoflow.models.contracts import InjectedContext
    from mnemoflow.models.round_store import StoreRoundInput, short_id

    store = FragmentStore(milvus_uri, HashingEmbeddings(), collection=unique_name)
    await store.ensure()
    read_model = ReadModel(redis_url, prefix=f"{unique_name}:")
    acts = RoundStoreActivities(store, read_model, None)
    env = ActivityEnvironment()
    user = "heavy-user"
    identity = Fragment(
        id=fragment_id(user, 1, 0),
        user_id=user,
        theme="me",
        types=["identity"],
        content="User: My name is Oona Lindqvist and I restore harpsichords.",
        created_at=NOW,
        reinforced_at=NOW,
        round_no=1,
    )
    try:
        await store.upsert([identity])
        await _long_history(store, user, 2, 40)
        query = "which trip to Quito was the teapot bought on?"

        async def picked(config: MemoryConfig, known: list[str] | None, n: int) -> set[str]:
            new = await _round(user, n, [("human", f"Trip {n}: Quito again, {n} euros.")])
            out = await env.run(
                acts.store_round,
                StoreRoundInput(
                    fragments=new,
                    select=SelectInput(user_id=user, query=query, config=config, now=NOW),
                    context=InjectedContext(user_id=user, version=n, generated_at=NOW),
                    known=None if known is None else [*known, *(f.id for f in new)],
                ),
            )
            assert out.candidates <= config.retrieve_k + 1 + len(new), out.candidates
            if known is None:
                return {c.fragment_id for c in out.picked}
            return {r.id for r in out.ranked[: config.top_k]}

        bounded = MemoryConfig(retrieve_k=8, top_k=3)
        assert identity.id in await picked(bounded, None, 41)
        held = await picked(bounded, [identity.id], 42)
        assert short_id(user, identity.id) in held
        no_floor = bounded.model_copy(update={"always_inject_types": ()})
        assert identity.id not in await picked(no_floor, None, 43)
    finally:
        await read_model.close()
        await store.drop()
        await store.close()
