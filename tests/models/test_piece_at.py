"""`models.fragments.piece_at` finds a piece where a pattern of it would, without compiling one
per piece (the model call's quote check ran ~20 ms of pattern compiles a call before)."""

from __future__ import annotations

import random
import re

from mnemoflow.models.fragments import piece_at


def _by_pattern(text: str, piece: str) -> tuple[int, int] | None:
    """piece_at as patterns state it: the piece escaped, else its characters with any
    whitespace between them; the first match that stands whole."""
    spans = [(m.start(), m.end()) for m in re.finditer(re.escape(piece), text)]
    if not spans:
        loose = r"\s*".join(re.escape(c) for c in piece if not c.isspace())
        spans = [(m.start(), m.end()) for m in re.finditer(loose, text)] if loose else []
    for at, end in spans:
        opens = at == 0 or not (text[at - 1].isalnum() and piece[0].isalnum())
        closes = end == len(text) or not (text[end - 1].isalnum() and text[end].isalnum())
        if opens and closes:
            return at, end
    return None


def test_examples() -> None:
    assert piece_at("I sent message 12 and message 1.", "message 1") == (22, 31)
    assert piece_at("message 12", "message 1") is None
    assert piece_at("我喜欢猫。我住在上海。", "我住在上海。") == (5, 11)
    assert piece_at("the  red\n car is here", "the red car") == (0, 13)
    assert piece_at("nothing here", "absent words") is None


def test_agrees_with_the_patterns_on_random_texts() -> None:
    rnd = random.Random(20261205)
    # letters, digits, spaces of several kinds (a non-breaking one, a separator control that
    # str.isspace and \s both count), punctuation, Chinese
    alphabet = "ab c\n\t.,。好猫\u00a0\x1cA1"
    checked = found = 0
    for _ in range(40_000):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 16)))
        if text and rnd.random() < 0.6:
            at = rnd.randint(0, len(text))
            piece = text[at : rnd.randint(at, len(text))]
            if rnd.random() < 0.5:  # the same words, spaced otherwise
                piece = piece.replace(" ", "").replace("\n", " ")
        else:
            piece = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(1, 5)))
        if not piece:
            continue
        expected = _by_pattern(text, piece)
        assert piece_at(text, piece) == expected, (text, piece)
        checked += 1
        found += expected is not None
    assert checked > 20_000 and found > 5_000
