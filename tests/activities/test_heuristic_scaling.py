"""The offline slicer's work grows linearly with the round, and its shortcuts change no output.

A round of 64 turns of 8,000 characters (emoji and CJK) took 53 s in the worker's local activity
and stalled every workflow on it: each piece of a long turn carried the whole turn's text into its
fragment's type search (quadratic in the turn), the fragment bound merged neighbours by scanning
every pair per merge (quadratic in the pieces), and cutting a run-on line re-counted the growing
piece per character. The work is counted here (characters searched, group sizes read, characters
estimated), never timed; and each shortcut is checked against the plain computation it replaces.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

import mnemoflow.activities.llm.heuristic as heuristic
import mnemoflow.activities.llm.heuristic_rules as rules
import mnemoflow.memory.text as text_module
from mnemoflow.activities.llm.heuristic import HeuristicMemoryModels
from mnemoflow.activities.llm.heuristic_rules import (
    GENERAL,
    THEMES,
    TYPE_REACH,
    TYPE_RULES,
    repeated,
    theme_label,
    theme_label_repeats,
    types_of,
    types_of_repeats,
)
from mnemoflow.models.turns import ChatTurn


def _dense_turns(turns: int, sentences: int) -> list[ChatTurn]:
    """Long human turns of numbered sentences mixing ASCII, emoji and CJK (~170 chars each)."""
    return [
        ChatTurn(
            thread_id="t",
            position=t,
            role="human",
            content=" ".join(f"M{t:03d}{i:05d}" + "😀🎉数据" * 40 + "." for i in range(sentences)),
            time=1000.0 + t,
        )
        for t in range(turns)
    ]


class _CountingPattern:
    def __init__(self, pattern: re.Pattern[str], work: Counter[str]) -> None:
        self.pattern, self.work = pattern, work

    def search(self, text: str) -> re.Match[str] | None:
        self.work["type chars"] += len(text)
        return self.pattern.search(text)


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts characters the type rules search, group sizes the fragment bound reads, and
    characters whose tokens are counted."""
    counts: Counter[str] = Counter()
    monkeypatch.setattr(
        rules, "TYPE_RULES", tuple((n, _CountingPattern(p, counts)) for n, p in TYPE_RULES)
    )

    class CountingGroup(heuristic._Group):
        def __getattribute__(self, name: str) -> Any:
            if name == "tokens":
                counts["size reads"] += 1
            return super().__getattribute__(name)

    monkeypatch.setattr(heuristic, "_Group", CountingGroup)
    real_units = text_module.token_units

    def counting_units(text: str, *args: Any) -> int:
        counts["estimated chars"] += len(text)
        return real_units(text, *args)

    monkeypatch.setattr(text_module, "token_units", counting_units)
    monkeypatch.setattr(heuristic, "token_units", counting_units)
    yield counts


async def _slice_work(turns: list[ChatTurn], work: Counter[str]) -> tuple[list[Any], Counter[str]]:
    work.clear()
    drafts = (await HeuristicMemoryModels().slice(turns, 16)).drafts
    return drafts, Counter(work)


def _check_shape(drafts: list[dict[str, Any]], turns: list[ChatTurn]) -> None:
    """16 fragments in conversation order that give back every turn, piece by piece."""
    assert len(drafts) == 16
    assert [d["start_idx"] for d in drafts] == sorted(d["start_idx"] for d in drafts)
    assert drafts[0]["start_idx"] == 0 and drafts[-1]["end_idx"] == len(turns) - 1
    lines = [line.removeprefix("User: ") for d in drafts for line in d["content"].split("\n")]
    assert "".join(lines).replace(" ", "") == "".join(t.content.replace(" ", "") for t in turns)
    for d in drafts:
        assert d["types"] == ["fact"]  # the digits; nothing else in the text states anything
        assert d["theme"] == "日常"


@pytest.mark.parametrize("grow", ["turns", "turn length"])
async def test_slicing_work_grows_linearly_with_the_round(grow: str, work: Counter[str]) -> None:
    small_turns = _dense_turns(4, 40)  # 4 turns of ~6,900 characters
    big_turns = _dense_turns(16, 40) if grow == "turns" else _dense_turns(4, 160)
    small_drafts, small = await _slice_work(small_turns, work)
    big_drafts, big = await _slice_work(big_turns, work)
    _check_shape(small_drafts, small_turns)
    _check_shape(big_drafts, big_turns)
    size = sum(len(t.content) for t in big_turns) / sum(len(t.content) for t in small_turns)
    assert 3.9 < size < 4.1
    for kind in ("type chars", "size reads", "estimated chars"):
        assert small[kind] > 0
        # Linear work is ~4x here (n log n a little more); the quadratic paths were 13-16x.
        assert big[kind] <= 5 * small[kind], (kind, small[kind], big[kind])
    # Each character's tokens are counted a bounded number of times (a run-on line's pieces
    # were re-counted per character added: ~60 times each).
    total = sum(len(t.content) for t in big_turns)
    assert big["estimated chars"] <= 10 * total, big["estimated chars"] / total


def _old_bounded(sizes: list[int], limit: int) -> list[list[int]]:
    """The fragment bound as a scan of every neighbouring pair per merge (the reference)."""
    groups = [[i] for i in range(len(sizes))]
    tokens = list(sizes)
    while len(groups) > max(1, limit):
        i = min(range(len(groups) - 1), key=lambda k: tokens[k] + tokens[k + 1])
        groups[i].extend(groups.pop(i + 1))
        tokens[i] += tokens.pop(i + 1)
    return groups


@pytest.mark.parametrize("seed", range(40))
def test_the_fragment_bound_merges_the_same_pairs_as_a_full_scan(seed: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.choice([1, 2, 3, 5, 8, 160]) for _ in range(rng.randint(1, 120))]  # many ties
    limit = rng.choice([0, 1, 2, 5, 16, 200])
    groups = []
    for i, size in enumerate(sizes):
        group = heuristic._Group(GENERAL)
        group.lines, group.indexes, group.tokens = [str(i)], [i], size
        groups.append(group)
    merged = HeuristicMemoryModels._bounded(groups, limit)
    assert [[int(line) for line in g.lines] for g in merged] == _old_bounded(sizes, limit)


def test_no_type_rule_match_reaches_further_than_type_reach() -> None:
    """`types_of_repeats` searches a long text twice however often it repeats: exact only while
    no match (with the character either side that \\b looks at) spans two joins."""
    from re import _parser  # type: ignore[attr-defined]

    for name, pattern in TYPE_RULES:
        _low, high = _parser.parse(pattern.pattern, pattern.flags).getwidth()
        assert high + 2 <= TYPE_REACH, name


_JOINS = [
    "I was there last",
    "week we met",
    "I am",
    "Alice said hi",
    "an engineer, I am",
    "a",
    "数据3",
    "岁",
    "can't",
    "stand it",
    "going",
    "to the park",
]


@pytest.mark.parametrize("seed", range(60))
def test_type_and_label_shortcuts_equal_the_plain_join(seed: int) -> None:
    rng = random.Random(seed)
    filler = ["数据", "😀", "hello", "world", "Mochi", "the", "x" * 70, "数" * 80]
    runs: list[tuple[str, int]] = []
    for _ in range(rng.randint(0, 6)):
        words = [rng.choice(_JOINS + filler) for _ in range(rng.randint(1, 5))]
        head, tail = rng.choice(_JOINS), rng.choice(_JOINS)
        runs.append((" ".join([tail, *words, head]), rng.choice([1, 2, 3, 7, 40])))
    joined = repeated(runs)
    assert types_of_repeats(runs) == types_of(joined)
    for theme in (GENERAL, *THEMES):
        assert theme_label_repeats(theme, runs) == theme_label(theme, joined)


def test_a_match_across_the_repeats_of_a_long_text_still_counts() -> None:
    # "... last" + " " + "week ..." only reads as an episode where the copies meet.
    text = "week " + "数据 " * 40 + "last"
    assert len(text) >= TYPE_REACH
    assert types_of(text) == ["chat"]
    for count in (2, 3, 50):
        assert types_of_repeats([(text, count)]) == types_of(repeated([(text, count)]))
        assert "episode" in types_of_repeats([(text, count)])


def _atoms(parsed: Any, flags: int) -> Iterator[str]:
    """Every character-consuming step of a parsed pattern, as a one-character regex."""
    from re import _constants as c  # type: ignore[attr-defined]

    categories = {c.CATEGORY_DIGIT: r"\d", c.CATEGORY_SPACE: r"\s", c.CATEGORY_WORD: r"\w"}
    for op, av in parsed:
        ignore = "(?i:{})" if flags & re.IGNORECASE else "(?-i:{})"
        if op is c.LITERAL:
            yield ignore.format(re.escape(chr(av)))
        elif op is c.IN:
            items = []
            for item, value in av:
                if item is c.LITERAL:
                    items.append(re.escape(chr(value)))
                elif item is c.RANGE:
                    items.append(f"{re.escape(chr(value[0]))}-{re.escape(chr(value[1]))}")
                elif item is c.CATEGORY:
                    items.append(categories[value])  # KeyError: a class this test must learn
                else:
                    raise AssertionError(f"unexpected class item {item}")
            yield ignore.format(f"[{''.join(items)}]")
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            yield from _atoms(av[2], flags)
        elif op is c.SUBPATTERN:
            _group, add, remove, sub = av
            yield from _atoms(sub, (flags | add) & ~remove)
        elif op is c.BRANCH:
            for branch in av[1]:
                yield from _atoms(branch, flags)
        elif op is c.AT:
            continue  # \b: zero-width, reads whether its neighbours are word characters
        else:
            raise AssertionError(f"unexpected pattern step {op}: keyword_view must learn it")


def test_the_keyword_view_drops_only_characters_no_pattern_takes_in() -> None:
    """Every character `keyword_view` treats as inert is refused by every consuming step of
    every theme and type pattern, as the regex engine itself decides (case folding included),
    over the BMP and the emoji and CJK extension planes."""
    from re import _parser  # type: ignore[attr-defined]

    patterns = [t.pattern for t in THEMES] + [p for _, p in TYPE_RULES]
    atoms = {a for p in patterns for a in _atoms(_parser.parse(p.pattern, p.flags), p.flags)}
    takes = re.compile("|".join(sorted(atoms)))
    inert = "".join(
        chr(code)
        for code in (*range(0xD800), *range(0xE000, 0x30000))
        if not rules._takeable(chr(code))
    )
    assert len(inert) > 50_000  # CJK, emoji, punctuation: most of the range
    assert takes.search(inert) is None, repr(takes.search(inert))
    assert takes.search("sſKk数字岁") is not None  # the check does see what the patterns take


@pytest.mark.parametrize("seed", range(60))
def test_the_keyword_view_finds_what_the_text_does(seed: int) -> None:
    rng = random.Random(seed)
    pieces = [
        "😀",
        "🎉",
        "数据",
        "，",
        "。",
        "猫",
        "岁",
        "3",
        "ſ",
        "K",
        " ",
        "I am ",
        "a",
        "dog",
        "_",
    ]
    pieces += ["last", "week", "my name", "订单", "周三", "晚上8点", "\u3000", "٣", "pm", "I'm"]
    text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
    view = rules.keyword_view(text)
    for theme in THEMES:
        assert theme.pattern.findall(view) == theme.pattern.findall(text), theme.key
    assert types_of(view) == types_of(text)
