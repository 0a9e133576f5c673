"""Question-aware search: BM25, reciprocal rank fusion, ranking by the formula, packing."""

from __future__ import annotations

import numpy as np
import pytest

from mnemoflow.memory.prompt import memory_tokens, render_fragments
from mnemoflow.memory.search import (
    BM25,
    SearchDoc,
    SearchIndex,
    budget_tokens,
    fragment_cost,
    pack,
    rrf,
)
from mnemoflow.memory.text import normalise, token_list
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.profile import UserProfile

NOW = 1_700_000_000.0


def _doc(i: int, content: str, types: tuple[str, ...] = ("chat",), theme: str = "t") -> SearchDoc:
    frag = ContextFragment(id=f"f{i}", theme=theme, types=list(types), content=content)
    return SearchDoc(fragment=frag, created_at=NOW - 86400 * i)


def _tokens(text: str) -> list[str]:
    return token_list(normalise(text))


def test_bm25_prefers_rare_terms_and_shorter_documents() -> None:
    docs = [
        _tokens("I went to the pottery class on Saturday"),
        _tokens("the class was fun and the class was long and the class was loud today"),
        _tokens("we talked about the weather"),
    ]
    bm = BM25(docs)
    scores = bm.scores(_tokens("pottery class"))
    assert scores[0] > scores[1] > 0.0
    assert scores[2] == 0.0
    assert BM25([]).scores(_tokens("anything")) == []


def test_bm25_matches_chinese_without_spaces() -> None:
    docs = [_tokens("我女儿叫小米，今年五岁"), _tokens("明天去公司开会")]
    scores = BM25(docs).scores(_tokens("你还记得我女儿的名字吗"))
    assert scores[0] > 0.0
    assert scores[1] == 0.0


def test_rrf_rewards_agreement_between_rankings() -> None:
    fused = rrf([[1, 2, 3], [3, 1, 4]])
    assert fused[1] > fused[3] > fused[2] > fused[4]
    assert fused[1] == pytest.approx(1 / 61 + 1 / 62)
    assert rrf([]) == {}


def test_search_finds_a_detail_among_many_by_words_or_by_meaning() -> None:
    filler = [_doc(i, f"small talk number {i} about nothing much") for i in range(2, 40)]
    target = _doc(1, "Caroline: I adopted a dog called Biscuit from the shelter last week")
    docs = [*filler, target]
    # Dense vectors: only the target points where the query vector does.
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(len(docs), 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    query_vec = vectors[-1] + 0.05
    config = MemoryConfig()

    lexical = SearchIndex(docs).search("what is the name of the dog?", None, config, NOW)
    assert lexical[0].id == "f1"
    index = SearchIndex(docs, vectors)
    dense = index.search("which pet joined the family?", query_vec, config, NOW)
    assert dense[0].id == "f1"
    assert SearchIndex(docs).search("zebra quantum", None, config, NOW) == []


def test_relevance_leads_but_the_type_floor_keeps_a_seat() -> None:
    docs = [
        _doc(1, "we discussed the dog Biscuit and his dog toys", ("chat",)),
        _doc(2, "my name is Caroline and I love my dog", ("identity",)),
        _doc(3, "the dog park was closed on Monday", ("chat",)),
    ]
    ranked = SearchIndex(docs).search("dog Biscuit", None, MemoryConfig(top_k=1), NOW)
    # With one seat, the floor type goes first; relevance orders the rest.
    assert [f.id for f in ranked] == ["f2", "f1", "f3"]
    ranked = SearchIndex(docs).search("dog Biscuit", None, MemoryConfig(top_k=3), NOW)
    assert ranked[0].id == "f2" and ranked[1].id == "f1"


def test_theme_cap_spreads_the_seats() -> None:
    docs = [
        _doc(1, "dog Biscuit walk", theme="pets"),
        _doc(2, "dog Biscuit food", theme="pets"),
        _doc(3, "dog Biscuit vet visit", theme="health"),
    ]
    config = MemoryConfig(top_k=2, theme_cap=1, always_inject_types=())
    ranked = SearchIndex(docs).search("dog Biscuit", None, config, NOW)
    assert {ranked[0].theme, ranked[1].theme} == {"pets", "health"}


def test_reinforcement_is_bounded_so_relevance_wins() -> None:
    used = SearchDoc(
        fragment=ContextFragment(id="used", theme="t", types=["chat"], content="dog"),
        created_at=NOW - 60,
        strengthen_count=1000,
    )
    asked = SearchDoc(
        fragment=ContextFragment(id="asked", theme="t", types=["chat"], content="dog walk Biscuit"),
        created_at=NOW - 400 * 86400,
    )
    config = MemoryConfig(always_inject_types=())
    ranked = SearchIndex([used, asked]).search("walk Biscuit dog", None, config, NOW)
    assert [f.id for f in ranked] == ["asked", "used"]
    assert ranked[0].created_at == NOW - 400 * 86400


def test_pack_respects_the_budget_and_skips_what_does_not_fit() -> None:
    big = ContextFragment(id="big", theme="t", types=["fact"], content="word " * 400)
    small = [
        ContextFragment(id=f"s{i}", theme="t", types=["fact"], content=f"short line number {i}")
        for i in range(10)
    ]
    packed = pack([small[0], big, *small[1:]], budget=100, used=20)
    assert "big" not in [f.id for f in packed]
    assert packed[0].id == "s0"
    total = 20 + memory_tokens(UserProfile(), packed)
    assert total <= 100
    # One more would not fit: the budget is used, not just respected.
    assert 20 + memory_tokens(UserProfile(), [*packed, small[-1]]) > 100
    assert pack(small, budget=10, used=20) == []


def test_estimate_tokens_counts_cjk_per_character() -> None:
    assert budget_tokens("") == 0
    assert budget_tokens("我女儿叫小米") == 6
    assert 20 <= budget_tokens("The quick brown fox jumps over the lazy dog. " * 2) <= 26


def test_rendered_fragments_carry_their_date() -> None:
    frag = ContextFragment(
        id="x", theme="pets", types=["fact"], content="Dog is Biscuit", created_at=1683554160.0
    )
    assert render_fragments([frag]) == "1. [pets | fact | 8 May 2023] Dog is Biscuit"


def test_pack_skips_near_duplicates_of_what_it_already_took() -> None:
    fact = ContextFragment(
        id="a", theme="t", types=["fact"], content="User: My daughter Lily plays the violin."
    )
    echo = ContextFragment(
        id="b", theme="t", types=["chat"], content="user: my daughter Lily plays the violin!"
    )
    other = ContextFragment(
        id="c", theme="t", types=["fact"], content="User: Lily's violin teacher is Mr Park."
    )
    assert [f.id for f in pack([fact, echo, other], budget=1000)] == ["a", "c"]


def test_choose_packs_what_the_search_found_else_falls_back_to_the_published_context() -> None:
    from mnemoflow.memory.search import choose_fragments
    from mnemoflow.models.contracts import InjectedContext
    from mnemoflow.models.profile import UserProfile

    def frag(i: int, thread: str = "old", said: float = 100.0) -> ContextFragment:
        return ContextFragment(
            id=f"f{i}",
            theme="t",
            types=["fact"],
            content=f"fact number {i} " + "word " * 30,
            thread_id=thread,
            created_at=said,
        )

    published = [frag(1), frag(2), frag(3)]
    context = InjectedContext(user_id="u", fragments=published, top_k=2)
    config = MemoryConfig(memory_budget_tokens=120)
    # Search answered: its ranking, minus what is still in this thread's window, to the budget.
    found = [frag(9, thread="here", said=900.0), frag(8), frag(7), frag(6)]
    chosen = choose_fragments(found, context, "here", 500.0, "fact", config)
    assert [f.id for f in chosen] == ["f8", "f7"]  # f9 is in the window; f6 over budget
    # A profile takes its share of the same budget first...
    rich = context.model_copy(update={"profile": UserProfile(name="Ada " * 40)})
    assert [f.id for f in choose_fragments(found, rich, "here", 500.0, "fact", config)] == ["f8"]
    # ... and no more than its share: a fact too long for it is left out, not the fragments.
    huge = context.model_copy(update={"profile": UserProfile(name="Ada " * 120)})
    chosen = choose_fragments(found, huge, "here", 500.0, "fact", config)
    assert [f.id for f in chosen] == ["f8", "f7"]
    # No search result (timeout, failure, nothing stored): the published context, up to top_k.
    assert [f.id for f in choose_fragments(None, context, "here", 500.0, "fact", config)] == [
        "f1",
        "f2",
    ]
    assert choose_fragments(None, None, "here", 500.0, "fact", config) == []


def _turns(thread: str, start: int, lines: list[str], i: int) -> SearchDoc:
    """A fragment of consecutive turns of `thread` from position `start`."""
    frag = ContextFragment(
        id=f"f{i}",
        theme="t",
        types=["chat"],
        content="\n".join(lines),
        thread_id=thread,
        start_pos=start,
        end_pos=start + len(lines),
    )
    return SearchDoc(fragment=frag, created_at=NOW - 86400)


CHAT = [f"User (Ann): small talk line {n} about the weather and the bus" for n in range(40)]


def test_excerpts_inject_the_matching_line_with_its_neighbours_across_fragments() -> None:
    import mnemoflow.memory.search as search

    lines = list(CHAT)
    lines[21] = "Assistant (Bo): how did the interview go?"
    lines[22] = "User (Ann): it went well, they offered me the job at the aquarium"
    lines[23] = "Assistant (Bo): congratulations!"
    docs = [_turns("s1", 0, lines[:20], 0), _turns("s1", 20, lines[20:], 1)]
    lines2 = list(CHAT[:10])
    lines2[0] = "User (Ann): the aquarium fed the otters today"
    docs.append(_turns("s2", 0, lines2, 2))
    index = SearchIndex(docs)
    found = index.excerpts("Where did Ann get a job?", None, MemoryConfig(), NOW, budget=120)
    text = "\n".join(f.content for f in found)
    # the line that matches, and the window of lines either side of it, verbatim
    window = range(22 - search.LINE_WINDOW, 22 + search.LINE_WINDOW + 1)
    assert all(lines[k] in text for k in window)
    assert found[0].id == "f1"  # the best line's fragment first
    assert lines[30] not in text  # far from any match: not spent on
    # lines left out between kept ones are marked, and the excerpt keeps the fragment's id
    assert search.GAP not in found[0].content.splitlines()[:3]

    edge = list(CHAT[:20])
    edge[19] = "User (Ann): my sister Mia moved to Lisbon"
    docs = [_turns("s1", 0, edge, 0), _turns("s1", 20, CHAT[20:40], 1)]
    found = SearchIndex(docs).excerpts("Where did Mia move?", None, MemoryConfig(), NOW, budget=150)
    by_id = {f.id: f.content for f in found}
    assert edge[19] in by_id["f0"]
    assert CHAT[20] in by_id["f1"]  # the next turn lives in the next fragment of the thread


def test_line_ranking_is_the_order_excerpts_take_lines_in() -> None:
    CONFIG = MemoryConfig()
    lines = list(CHAT)
    lines[7] = "User (Ann): the pottery class starts on Monday"
    lines[33] = "User (Ann): my pottery bowl cracked in the kiln at the pottery class"
    docs = [_turns("s", 0, lines[:20], 0), _turns("s", 20, lines[20:], 1)]
    index = SearchIndex(docs)
    order = index.line_ranking("pottery class", index.search("pottery class", None, CONFIG, NOW))
    said = [index.lines[d][n] for d, n in index.line_refs]
    # both lines that match lead, each once; every line is a position into `line_refs`
    assert {said[r] for r in order[:2]} == {lines[7], lines[33]}
    assert len(order) == len(set(order)) and all(0 <= r < len(said) for r in order)
    # the excerpt of a one-window budget is the best line's window
    found = index.excerpts("pottery class", None, CONFIG, NOW, budget=120)
    assert said[order[0]] in "\n".join(f.content for f in found)
    assert said[order[1]] not in "\n".join(f.content for f in found)


def test_excerpts_fill_the_budget_and_stop() -> None:
    docs = [
        _turns("s", 10 * i, [f"User: line {i}-{n} about pottery class" for n in range(10)], i)
        for i in range(20)
    ]
    config = MemoryConfig(memory_budget_tokens=300)
    found = SearchIndex(docs).excerpts("pottery class", None, config, NOW)
    assert found
    assert memory_tokens(UserProfile(), found) <= 300
    assert sum(fragment_cost(f, n) for n, f in enumerate(found, 1)) <= 300
    assert SearchIndex(docs).excerpts("zebra quantum", None, config, NOW) == []


def test_normalise_blanks_punctuation_and_symbols_of_any_script() -> None:
    assert normalise("Hello, World! It's ＡＢＣ ＄100 — naïve") == "hello world it s abc 100 naïve"
    assert normalise("我女儿叫小米，她在学小提琴。") == "我女儿叫小米 她在学小提琴"
    assert normalise("x_y\tz\u200b!") == "x y z"
    assert normalise("") == ""
