"""Embeddings: the real multilingual USE model (Chinese and English) and the hashing stand-in."""

from __future__ import annotations

import numpy as np
import pytest

from mnemoflow.activities.embeddings import HashingEmbeddings, UniversalSentenceEncoderEmbeddings


@pytest.fixture(scope="module")
def use() -> UniversalSentenceEncoderEmbeddings:
    """One USE model for the module (loading it takes about a second)."""
    return UniversalSentenceEncoderEmbeddings(threads=2)


def cos(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two vectors."""
    va, vb = np.asarray(a), np.asarray(b)
    return float(va @ vb / (np.linalg.norm(va) * np.linalg.norm(vb)))


def test_use_vectors_are_512_dim_normalised_python_floats(
    use: UniversalSentenceEncoderEmbeddings,
) -> None:
    docs = use.embed_documents(["hello", "你好", ""])
    assert len(docs) == 3 and all(len(v) == use.dim == 512 for v in docs)
    assert all(type(x) is float for x in docs[0])
    assert all(np.linalg.norm(v) == pytest.approx(1.0, abs=1e-4) for v in docs[:2])
    assert use.embed_documents([]) == []
    assert cos(use.embed_query("hello"), docs[0]) == pytest.approx(1.0, abs=1e-5)


def test_use_similarity_across_and_within_languages(
    use: UniversalSentenceEncoderEmbeddings,
) -> None:
    order_en, order_zh, hiking, weather_zh, refund_zh = use.embed_documents(
        [
            "My order number is 12345",
            "我的订单号是12345",
            "I like hiking in the mountains on weekends",
            "今天天气很好，阳光明媚",
            "我想退货，请帮我查一下订单",
        ]
    )
    assert cos(order_en, order_zh) > 0.6  # the same sentence in two languages
    assert cos(order_en, order_zh) > cos(order_en, hiking) + 0.3
    assert cos(order_zh, refund_zh) > cos(order_zh, weather_zh)
    query = use.embed_query("周末去爬山")  # "hiking at the weekend"
    assert cos(query, hiking) > cos(query, order_en)


async def test_async_variants_use_the_sync_implementation(
    use: UniversalSentenceEncoderEmbeddings,
) -> None:
    [doc] = await use.aembed_documents(["busy on Wednesdays"])
    query = await use.aembed_query("busy on Wednesdays")
    assert cos(doc, query) == pytest.approx(1.0, abs=1e-5)


def test_hashing_is_deterministic_and_normalised() -> None:
    first, second = HashingEmbeddings(), HashingEmbeddings()
    text = "Order A-1234 shipped 周一"
    assert first.embed_query(text) == second.embed_query(text)
    assert first.embed_documents([text, text]) == [first.embed_query(text)] * 2
    assert np.linalg.norm(first.embed_query(text)) == pytest.approx(1.0, abs=1e-6)
    assert np.linalg.norm(first.embed_query("")) == pytest.approx(1.0, abs=1e-6)
    assert len(HashingEmbeddings(dim=64).embed_query(text)) == 64


def test_hashing_prefers_shared_words() -> None:
    emb = HashingEmbeddings()
    query = emb.embed_query("where is my order")
    related = emb.embed_query("my order was shipped")
    unrelated = emb.embed_query("rainy weather today")
    assert cos(query, related) > cos(query, unrelated)


def test_constructor_validation() -> None:
    with pytest.raises(ValueError):
        UniversalSentenceEncoderEmbeddings(threads=0)
    with pytest.raises(ValueError):
        HashingEmbeddings(dim=4)
