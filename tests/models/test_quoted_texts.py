"""`models.fragments.quoted_texts` keeps the spoken lines of QUOTE_MIN_CHARS or more characters
that are not whitespace, whatever kind of whitespace separates them (as `str.isspace` says)."""

from __future__ import annotations

import random

from mnemoflow.models.fragments import QUOTE_MIN_CHARS, quoted_texts


def _by_isspace(content: str) -> list[str]:
    """The definition, character by character."""
    from mnemoflow.models.fragments import spoken_lines

    lines = [ln.text for ln in spoken_lines(content) if ln.role and ln.text]
    texts = lines or [content.strip()]
    return [t for t in texts if sum(not c.isspace() for c in t) >= QUOTE_MIN_CHARS]


def test_the_threshold_counts_characters_that_are_not_whitespace() -> None:
    spaced = "\u3000".join("abcdefghijklmnop")  # 16 letters, ideographic spaces between
    assert quoted_texts(f"User (Ada): {spaced}") == [spaced]
    assert quoted_texts(f"User (Ada): {spaced[:-2]}") == []  # 15 letters
    assert quoted_texts("User (Ada): 我喜欢猫。我住在上海。我有两只猫和一只狗") != []


def test_agrees_with_the_definition_on_random_contents() -> None:
    rnd = random.Random(20261207)
    # letters, CJK, spaces of several kinds: a non-breaking one, an ideographic one, a separator
    # control (str.isspace and str.split agree on all of them), tabs and newlines
    alphabet = "ab c\n\t.,好猫\u00a0\u3000\x1c\u2003A1"
    kept = 0
    for _ in range(5_000):
        lines = [
            rnd.choice(["User (Ada): ", "Assistant: ", ""])
            + "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 40)))
            for _ in range(rnd.randint(1, 4))
        ]
        content = "\n".join(lines)
        expected = _by_isspace(content)
        assert quoted_texts(content) == expected, content
        kept += len(expected)
    assert kept > 1_000
