"""Query-time re-ranking: the latest question can promote a fragment the round ranked lower."""

from mnemoflow.memory.rerank import rerank_for_query
from mnemoflow.memory.text import query_overlap
from mnemoflow.models.contracts import ContextFragment


def frag(fid: str, content: str, score: float, theme: str = "general") -> ContextFragment:
    return ContextFragment(id=fid, theme=theme, types=["fact"], content=content, score=score)


def test_overlap_ignores_question_words_and_matches_inflections() -> None:
    assert query_overlap("Where should the parcel be shipped?", "Please ship it to 2 Elm St") == 0.5
    assert query_overlap("Which card did I pay with?", "the card ending in 7291") == 0.5
    assert query_overlap("What?", "anything") == 0.0
    assert query_overlap("我的狗叫什么", "我的狗叫饼干") > 0.5


def test_rerank_promotes_the_fragment_the_question_is_about() -> None:
    published = [
        frag("a", "I like gardening", 0.9),
        frag("b", "My order number is 5512", 0.8),
        frag("c", "Ship it to 221 Baker Street", 0.5),
    ]
    ranked = rerank_for_query(published, "Where do you ship my parcel?")
    assert ranked[0].id == "c"
    assert [f.id for f in rerank_for_query(published, "")] == ["a", "b", "c"]


def test_rerank_keeps_published_order_on_ties() -> None:
    published = [frag("x", "alpha", 0.5), frag("y", "beta", 0.5)]
    assert [f.id for f in rerank_for_query(published, "gamma?")] == ["x", "y"]


def test_reinforcement_follows_evidence_of_use_not_injection() -> None:
    from mnemoflow.memory.rerank import MAX_REINFORCED, drawn_on

    def frag(i: int, content: str) -> ContextFragment:
        return ContextFragment(id=f"f{i}", theme="t", types=["fact"], content=content)

    violin = frag(1, "User: My daughter Lily started violin lessons on Saturdays.")
    order = frag(2, "User: My order 7734-221 has not arrived.")
    assert drawn_on("Lily has violin lessons on Saturdays.", [order, violin]) == [violin]
    assert drawn_on("Let me check that for you.", [order, violin]) == []
    # a short generic reply shares half its few words with some fragment by chance: not use
    notes = frag(4, "User: I will check the weather notes later.")
    assert drawn_on("I will check my notes.", [notes]) == []
    assert drawn_on("", [violin]) == []
    # 您女儿 draws on a Chinese fragment by characters, without spaces.
    zh = frag(3, "User: 我女儿叫小米，她在学小提琴。")
    assert drawn_on("您女儿小米在学小提琴。", [violin, zh]) == [zh]
    many = [frag(i, "Lily violin Saturdays") for i in range(10)]
    assert len(drawn_on("Lily violin Saturdays", many)) == MAX_REINFORCED


def test_overlap_of_wanted_tokens_is_query_overlap() -> None:
    """`drawn_on` and `rerank_for_query` make a query's tokens once (`wanted_tokens`) and compare
    them with each fragment (`overlap`): the same figure as `query_overlap`, pair by pair."""
    from mnemoflow.memory.text import overlap, wanted_tokens

    texts = [
        "Please ship it to 2 Elm St",
        "the card ending in 7291",
        "我的狗叫饼干",
        "Shipped deliveries arrive on Wednesdays; playing chess with Ada.",
        "",
    ]
    queries = [
        "Where should the parcel be shipped?",
        "Which card did I pay with?",
        "What?",
        "我的狗叫什么",
        "delivery on Wednesday, and who plays chess?",
    ]
    for q in queries:
        wanted = wanted_tokens(q)
        for t in texts:
            assert overlap(wanted, t) == query_overlap(q, t), (q, t)
