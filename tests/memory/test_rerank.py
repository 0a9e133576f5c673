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
