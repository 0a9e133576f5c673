"""Trigger rules: durable-timer due times, budgets, the hard ceiling and where trimming starts."""

import math

import pytest

from mnemoflow.memory.text import (
    BUDGET_CHARS_PER_TOKEN,
    WINDOW_CHARS_PER_TOKEN,
    estimate_tokens,
    token_units,
)
from mnemoflow.memory.triggers import (
    budget_reached,
    ceiling_reached,
    induction_due_at,
    slice_due_at,
    trim_start,
)
from mnemoflow.models.config import MemoryConfig, Vocation

CS = MemoryConfig.from_vocation(Vocation.CUSTOMER_SERVICE)


def test_slice_due_about_870_seconds_after_the_oldest_unsliced_message():
    assert slice_due_at(1000.0, CS) == pytest.approx(1000 + 600 * math.log(1 / 0.3) ** 2)
    assert slice_due_at(1000.0, CS) - 1000 == pytest.approx(869.8, abs=0.1)


def test_induction_due_about_3181_seconds_after_creation():
    assert induction_due_at(50.0, CS) == pytest.approx(50 + 600 * math.log(10) ** 2)
    assert induction_due_at(50.0, CS) - 50 == pytest.approx(3181.1, abs=0.1)


def test_collaborative_creation_preset_due_times():
    cfg = MemoryConfig.from_vocation(Vocation.COLLABORATIVE_CREATION)
    # c_m = 1: dt = tau_m * -ln(1 - v)
    assert slice_due_at(0.0, cfg) == pytest.approx(3600 * math.log(10))
    assert induction_due_at(0.0, cfg) == pytest.approx(3600 * math.log(50))


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("a", 1),
        ("x" * 33, 10),  # exactly 33 / 3.3, with no floating-point surprise
        ("x" * 34, 11),
        ("你好世界", 4),  # one token per CJK character
        ("你好 world", 2 + 2),  # 2 CJK + ceil(6 / 3.3)
        ("こんにちは", 5),
    ],
)
def test_estimate_tokens(text, tokens):
    assert estimate_tokens(text) == tokens


def test_budget_fraction_of_max_input_tokens():
    cfg = MemoryConfig(pattern="fraction", trigger_threshold=0.8, max_input_tokens=1000)
    assert not budget_reached(999, 799, cfg)
    assert budget_reached(1, 800, cfg)


def test_budget_in_tokens():
    cfg = MemoryConfig(pattern="tokens", trigger_threshold=5000)
    assert not budget_reached(10_000, 4999, cfg)
    assert budget_reached(1, 5000, cfg)


def test_budget_in_messages():
    cfg = MemoryConfig(pattern="messages", trigger_threshold=20)
    assert not budget_reached(19, 10**9, cfg)
    assert budget_reached(20, 0, cfg)


def test_ceiling_is_a_fraction_of_max_input_tokens():
    cfg = MemoryConfig(hard_ceiling=0.95, max_input_tokens=1000)
    assert not ceiling_reached(949, cfg)
    assert ceiling_reached(950, cfg)


@pytest.mark.parametrize(
    ("total", "indexed", "last_human", "start"),
    [
        (20, 12, 18, 12),  # trim everything indexed
        (20, 12, 7, 7),  # never past the latest human message
        (20, 12, None, 12),
        (20, 0, 5, 0),  # nothing indexed: nothing trimmed
        (20, -3, None, 0),  # never negative
        (10, 15, None, 10),  # never beyond the window
    ],
)
def test_trim_start(total, indexed, last_human, start):
    assert trim_start(total, indexed, last_human) == start


# cl100k_base counts of one sentence per script ("my daughter ... starts school on 4 September
# and is allergic to peanuts"), measured with bpe-openai's cl100k_base. A model-free estimate
# cannot be exact; it must not be off by more than the band below, in either direction. Counting
# non-CJK letters as ASCII undercounted these 2.5-8.5 times, so the memory budget and the
# window's ceiling were overrun by that much for these users.
_CL100K = [
    ("Моя дочь Лили пойдёт в школу четвёртого сентября, у неё аллергия на арахис.", 48),
    ("Η κόρη μου η Λίλη ξεκινά σχολείο στις 4 Σεπτεμβρίου και είναι αλλεργική στα φιστίκια.", 73),
    ("ابنتي ليلي تبدأ المدرسة في الرابع من سبتمبر وهي تعاني من حساسية الفول السوداني.", 48),
    ("הבת שלי לילי מתחילה בית ספר ברביעי בספטמבר והיא אלרגית לבוטנים.", 60),
    ("मेरी बेटी लिली चार सितंबर को स्कूल जाना शुरू करेगी और उसे मूंगफली से एलर्जी है।", 80),
    ("ลูกสาวของฉันลิลลี่จะเริ่มไปโรงเรียนวันที่สี่กันยายนและเธอแพ้ถั่วลิสง", 64),
    ("என் மகள் லில்லி செப்டம்பர் 4 அன்று பள்ளி தொடங்குகிறாள், அவளுக்கு வேர்க்கடலை ஒவ்வாமை.", 112),
    ("ჩემი ქალიშვილი ლილი სკოლას 4 სექტემბერს იწყებს და მიწის თხილზე ალერგია აქვს.", 139),
    ("Con gái tôi Lily bắt đầu đi học vào ngày 4 tháng 9 và bé bị dị ứng đậu phộng.", 42),
    ("Moja córka Łucja zaczyna szkołę 4 września i jest uczulona na orzeszki ziemne.", 36),
    ("🎉🎂🥜🚫👧🏫 ❤️❤️ 👍🏽👍🏽", 34),
    ("My daughter Lily starts school on the 4th of September and she is allergic to peanuts.", 19),
    ("こんにちは、私は東京に住んでいます。毎朝コーヒーを飲んで、電車で会社に行きます。", 41),
]


@pytest.mark.parametrize(("text", "cl100k"), _CL100K)
def test_budget_estimate_tracks_cl100k_in_every_script(text: str, cl100k: int) -> None:
    estimate = estimate_tokens(text, BUDGET_CHARS_PER_TOKEN)
    assert 0.65 * cl100k <= estimate <= 1.65 * cl100k, (estimate, cl100k)
    # the window's ceiling counts higher still, never lower
    assert estimate_tokens(text) >= estimate


def test_token_units_add_up_over_concatenation() -> None:
    pieces = [text for text, _ in _CL100K] + ["x" * 7, "你好", "é", "\ud83d"]  # lone surrogate too
    for chars in (WINDOW_CHARS_PER_TOKEN, BUDGET_CHARS_PER_TOKEN):
        assert token_units("".join(pieces), chars) == sum(token_units(p, chars) for p in pieces)
