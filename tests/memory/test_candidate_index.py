"""Ranking and packing of the candidates a store's hybrid search returned
(`memory.search.CandidateIndex`), and the analysed terms a line is indexed by (`memory.lines`)."""

from __future__ import annotations

import mnemoflow.memory.search as search
from mnemoflow.memory.lines import indexed_terms, line_id, query_terms, term_token
from mnemoflow.memory.prompt import memory_tokens
from mnemoflow.memory.search import CandidateIndex, SearchDoc, SearchIndex, fragment_cost
from mnemoflow.memory.text import normalise, token_list
from mnemoflow.models.config import MemoryConfig
from mnemoflow.models.contracts import ContextFragment
from mnemoflow.models.profile import UserProfile

NOW = 1_700_000_000.0
CONFIG = MemoryConfig()
CHAT = [f"User (Ann): small talk line {n} about the weather and the bus" for n in range(40)]


def _turns(
    thread: str, start: int, lines: list[str], i: int, types: tuple[str, ...] = ("chat",)
) -> SearchDoc:
    frag = ContextFragment(
        id=f"f{i}",
        theme="t",
        types=list(types),
        content="\n".join(lines),
        thread_id=thread,
        start_pos=start,
        end_pos=start + len(lines),
    )
    return SearchDoc(fragment=frag, created_at=NOW - 86400 * (i + 1))


def test_the_store_s_scores_rank_the_lines_and_the_windows_cross_into_neighbours() -> None:
    lines = list(CHAT)
    lines[19] = "User (Ann): my sister Mia moved to Lisbon"
    docs = [_turns("s1", 0, lines[:20], 0), _turns("s1", 20, lines[20:], 1)]
    # the store found one line of f0; f1 is only its neighbour in the thread
    index = CandidateIndex(docs, {"f0": 0.03}, {("f0", 19): 0.03})
    found = index.excerpts("Where did Mia move?", None, CONFIG, NOW, budget=150)
    by_id = {f.id: f.content for f in found}
    assert lines[19] in by_id["f0"]
    assert lines[17] in by_id["f0"] and lines[18] in by_id["f0"]
    assert lines[20] in by_id["f1"]  # the next turn, in the next fragment of the thread
    assert lines[5] not in by_id["f0"]  # far from the match: not spent on
    assert found[0].id == "f0"


def test_the_lexical_side_is_the_store_s_not_a_local_bm25() -> None:
    lines = list(CHAT)
    lines[3] = "User (Ann): the pottery class starts on Monday"
    lines[33] = "User (Ann): my pottery bowl cracked in the kiln"
    docs = [_turns("s", 0, lines[:20], 0), _turns("s", 20, lines[20:], 1)]
    # a local BM25 puts line 3 (both words) first; the store ranked line 33 first
    local = SearchIndex(docs)
    said = [local.lines[d][n] for d, n in local.line_refs]
    assert (
        said[
            local.line_ranking("pottery class", local.search("pottery class", None, CONFIG, NOW))[0]
        ]
        == lines[3]
    )
    given = CandidateIndex(docs, {"f1": 0.033, "f0": 0.016}, {("f1", 13): 0.033, ("f0", 3): 0.016})
    order = given.line_ranking("pottery class", given.search("pottery class", None, CONFIG, NOW))
    assert said[order[0]] == lines[33]
    found = given.excerpts("pottery class", None, CONFIG, NOW, budget=120)
    assert lines[33] in found[0].content
    assert lines[3] not in "\n".join(f.content for f in found)  # one window's budget


def test_the_memory_formula_ranks_the_candidates() -> None:
    old = _turns("s1", 0, ["User: I like green tea"], 0)
    old = SearchDoc(old.fragment, NOW - 400 * 86400)
    new = _turns("s2", 0, ["User: I like black tea"], 1)
    ident = _turns("s3", 0, ["User: my name is Ann and I like tea"], 2, ("identity",))
    index = CandidateIndex([old, new, ident], {"f0": 0.02, "f1": 0.02, "f2": 0.01}, {})
    ranked = [f.id for f in index.search("tea", None, CONFIG, NOW)]
    assert ranked.index("f1") < ranked.index("f0")  # as relevant, fresher
    assert "f2" in ranked[: CONFIG.top_k]  # the identity type keeps a seat


def test_a_fragment_the_store_did_not_return_is_never_a_candidate_of_its_own() -> None:
    a = _turns("s1", 0, ["User: the zebra escaped"], 0)
    b = _turns("s2", 0, ["User: zebra again"], 1)
    index = CandidateIndex([a, b], {"f0": 0.02, "gone": 0.05}, {("f0", 0): 0.02})
    assert [f.id for f in index.search("zebra", None, CONFIG, NOW)] == ["f0"]
    found = index.excerpts("zebra", None, CONFIG, NOW)
    assert [f.id for f in found] == ["f0"]


def test_candidates_pack_into_the_budget_with_the_profile() -> None:
    docs = [
        _turns("s", 10 * i, [f"User: line {i}-{n} about pottery class" for n in range(10)], i)
        for i in range(20)
    ]
    scores = {(f"f{i}", n): 1.0 / (60 + 10 * i + n) for i in range(20) for n in range(10)}
    relevance = {f"f{i}": 1.0 / (60 + 10 * i) for i in range(20)}
    profile = UserProfile(name="Ann", occupation="potter")
    config = MemoryConfig(memory_budget_tokens=300)
    found = CandidateIndex(docs, relevance, scores).excerpts(
        "pottery class", None, config, NOW, profile=profile
    )
    assert found
    assert memory_tokens(profile, found) <= 300
    assert sum(fragment_cost(f, n) for n, f in enumerate(found, 1)) <= 300
    assert CandidateIndex(docs, {}, {}).excerpts("pottery class", None, config, NOW) == []
    # left out as still in the window: the budget goes to the others
    skipped = CandidateIndex(docs, relevance, scores).excerpts(
        "pottery class", None, config, NOW, exclude=lambda f: f.id == "f0"
    )
    assert skipped and "f0" not in {f.id for f in skipped}


def test_a_term_is_one_hex_word_whatever_its_script() -> None:
    for term in ("violin", "小提", "琴", "naïve", "4471"):
        token = term_token(term)
        assert token.startswith("t") and len(token) == 1 + 12
        assert token.isalnum() and token == token.lower()
    assert term_token("violin") != term_token("violins")


def test_indexed_terms_are_the_in_process_search_s_tokens() -> None:
    line = "User: My daughter is playing the violin on Saturdays"
    assert indexed_terms(line).split() == [term_token(t) for t in token_list(normalise(line))]
    # English stemming: the question's words meet the line's in other forms
    asked = set(query_terms("Who plays violins on Saturday?").split())
    assert {term_token("play"), term_token("violin"), term_token("saturday")} <= asked
    assert asked <= set(indexed_terms(line).split())
    # Chinese: characters and bigrams, without spaces in the text
    zh = set(indexed_terms("我女儿在学小提琴").split())
    assert {term_token("小提"), term_token("提琴")} <= zh
    assert term_token("小提琴") not in zh
    # question words go, unless they are all there is
    assert term_token("what") not in query_terms("What did Ann buy?").split()
    assert query_terms("what?") == term_token("what")


def test_a_line_id_is_its_fragment_s_and_its_position() -> None:
    assert line_id("abc-r1-f0", 3) == "abc-r1-f0#3"


def test_a_one_window_budget_takes_the_best_line_and_its_neighbours() -> None:
    depth = search.LINE_WINDOW
    lines = list(CHAT[:20])
    lines[10] = "User (Ann): the otters at the aquarium"
    docs = [_turns("s", 0, lines, 0)]
    found = CandidateIndex(docs, {"f0": 0.03}, {("f0", 10): 0.03}).excerpts(
        "otters", None, CONFIG, NOW, budget=100
    )
    kept = found[0].content.splitlines()
    assert set(lines[10 - depth : 10 + depth + 1]) <= set(kept)
    assert lines[0] not in kept and lines[19] not in kept
