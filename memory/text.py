"""Text normalisation and content tokens shared by profile merging and query re-ranking.

Deterministic and model-free; English words are stemmed crudely and CJK runs become character
unigrams and bigrams, since CJK has no spaces.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from functools import lru_cache

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(f"[^\\s{_CJK}]+")
_NON_ASCII_RUN = re.compile("[^\\x00-\\x7f]+")
# Words that change nothing about a profile item. Negations ("not", "no", "never") are kept on
# purpose: they change everything.
_STOPWORDS = frozenset(
    "a an the is are am was were be been being has have had do does did on in at of to for from "
    "with by and or but very really so also always usually often every each all any some my his "
    "her their its our your i me he she they them we you it this that these those user s t".split()
)


class _Blanks(dict[int, int]):
    """str.translate table: punctuation, symbols, separators and control characters become a
    space, everything else stays; each character's category is looked up once, then cached
    (translate then runs in C: a per-character Python loop made rebuilding a user's search
    index cost ~1 ms a fragment)."""

    def __missing__(self, code: int) -> int:
        kept = 32 if unicodedata.category(chr(code))[0] in "PSZC" else code
        if len(self) < 65536:
            self[code] = kept
        return kept


_BLANKS = _Blanks()


def normalise(text: str) -> str:
    """NFKC, case-folded, punctuation and symbols replaced by spaces, whitespace collapsed."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(folded.translate(_BLANKS).split())


#: Stems kept (a word's stem is looked up, not recomputed: token lists are built for every
#: line a search ranks and every fragment a reply is checked against, ~50 words each).
STEM_CACHE = 1 << 16


@lru_cache(maxsize=STEM_CACHE)
def _stem(word: str) -> str:
    # A tiny suffix stripper: enough to make "Wednesdays"/"Wednesday", "plays"/"playing" meet.
    if len(word) > 4:
        for suffix in ("ing", "ed", "es", "s"):
            if word.endswith(suffix) and not word.endswith("ss"):
                word = word[: -len(suffix)]
                break
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


def token_list(norm: str) -> list[str]:
    """Content tokens with repeats, in order (for term frequencies): stemmed non-stopwords, then
    CJK character unigrams and bigrams of each run."""
    tokens = [_stem(w) for w in _WORD.findall(norm) if w not in _STOPWORDS]
    for run in _CJK_RUN.findall(norm):
        tokens.extend(run)
        tokens.extend(run[i : i + 2] for i in range(len(run) - 1))
    return tokens


#: Characters per token of non-CJK text. The window's hard ceiling counts high on purpose (a
#: window must never overflow); the memory budget counts what cl100k_base averages on English
#: prose (~4.2), since a budget filled at 3.3 would carry a fifth less memory.
WINDOW_CHARS_PER_TOKEN = 3.3
BUDGET_CHARS_PER_TOKEN = 4.0


def estimate_tokens(text: str, chars_per_token: float = WINDOW_CHARS_PER_TOKEN) -> int:
    """The one model-free token estimate: a CJK character is about one token (counting it as a
    fraction undercounts Chinese about threefold), other text `chars_per_token` characters a
    token, rounded up, so non-empty text is at least 1 token. Integer arithmetic on tenths keeps
    it exact (33 / 3.3 is not 10 in floating point)."""
    tenths = round(chars_per_token * 10)
    return -(-token_units(text, chars_per_token) // tenths)


def token_units(text: str, chars_per_token: float = WINDOW_CHARS_PER_TOKEN) -> int:
    """`estimate_tokens` before rounding, in tenths of a character: units add up over
    concatenation, so a packer can sum the pieces of a text and round once. An ASCII character
    is 10 units; a CJK character `chars_per_token` * 10 (a token); any other character half a
    token per UTF-8 byte (rounded up): byte-level BPE vocabularies (cl100k_base) cut Cyrillic,
    Greek, Hebrew and Arabic letters into about one token each, Devanagari, Thai and Tamil
    letters into one or two, emoji into two or more, where counting them as ASCII undercounted
    them two to eight times (docs/ARCHITECTURE.md, "Token estimates")."""
    if text.isascii():
        return len(text) * 10
    tenths = round(chars_per_token * 10)
    units = 0
    wide = 0  # characters outside ASCII
    for run in _NON_ASCII_RUN.findall(text):
        wide += len(run)
        cjk = sum(len(r) for r in _CJK_RUN.findall(run))
        other_bytes = len(run.encode("utf-8", "surrogatepass")) - 3 * cjk  # CJK here: 3 bytes
        units += cjk * tenths + other_bytes * ((tenths + 1) // 2)
    return units + (len(text) - wide) * 10


def content_tokens(norm: str) -> set[str]:
    """Content tokens: stemmed non-stopwords, plus CJK character unigrams and bigrams (CJK has
    no spaces, so characters and their pairs stand in for words)."""
    tokens = {_stem(w) for w in _WORD.findall(norm) if w not in _STOPWORDS}
    for run in _CJK_RUN.findall(norm):
        tokens.update(run)
        tokens.update(run[i : i + 2] for i in range(len(run) - 1))
    return tokens


# Words that make a question a question but say nothing about what is asked for (as tokens).
_QUESTION_WORDS = content_tokens(
    normalise(
        "what which where when who whom whose why how should could would can will shall may "
        "might please again tell know remember 什么 哪 哪里 哪儿 吗 呢 谁 怎么 几"
    )
)


#: Tokens of words that only make a sentence a question (interrogatives and auxiliaries).
QUESTION_TOKENS = _QUESTION_WORDS | content_tokens(
    normalise("did does do is are was were has have had am")
)


def query_overlap(query: str, text: str) -> float:
    """Share of the query's content tokens found in text (exact, or a shared 4-char prefix).

    The prefix match lets "shipped" meet "ship" and "deliveries" meet "delivery" where the tiny
    stemmer does not.
    """
    return overlap(wanted_tokens(query), text)


def wanted_tokens(query: str) -> frozenset[str]:
    """The content tokens `query_overlap` looks for (its question words left out): made once
    for a query compared with many texts (`overlap`)."""
    return frozenset(content_tokens(normalise(query)) - _QUESTION_WORDS)


def overlap(wanted: frozenset[str], text: str) -> float:
    """`query_overlap` for a query's `wanted_tokens`."""
    if not wanted:
        return 0.0
    have = content_tokens(normalise(text))
    prefixes = {t[:4] for t in have if len(t) >= 4}
    hits = sum(1 for t in wanted if t in have or (len(t) >= 4 and t[:4] in prefixes))
    return hits / len(wanted)


# Words of reading memory back ("from what I have", "you mentioned", "according to my notes"),
# of not answering yet ("let me check") or of asking for a name: they make no fact of their own.
_RECALL_WORDS = content_tokens(
    normalise(
        "from have got noted note notes recall remember remind memory mentioned mention told said "
        "saying earlier before according yes yeah sure okay ok still again name named called "
        "check checking look looking let moment"
    )
)
#: CJK characters that carry no fact in a question or an answer read back: pronouns, particles,
#: question words and the words of remembering (CJK is compared character by character here).
_CJK_FUNCTION = frozenset(
    "我你您他她它们的了是在对有和也都就还吗呢吧啊呀么什哪谁几多少怎记得录根据之前说过提到好名字叫请告诉提醒下一"
)
_SPEAKER_LABEL = re.compile(r"^(?:User|Assistant)(?: \([^)\n]*\))?:\s*", re.MULTILINE)
#: Share of a fragment's content tokens one earlier fragment must hold for it to add nothing.
RESTATED_SHARE = 0.8
#: Below this many content tokens a fragment that states something is never judged a repeat
#: (short lines share their few words with something by chance).
RESTATED_MIN_TOKENS = 8


#: Negations: a fact and its negation differ by one of these, so they are never dropped as
#: the words of a question or of reading back ("note" stems to "not").
NEGATIONS = frozenset({"no", "not", "never", "nor", "none", "nothing", "neither", "without"})
# "don't", "can't", "isn't": the negation as a word of its own ("can" is a question word).
_CONTRACTED_NOT = re.compile(r"n['\u2019]t\b", re.IGNORECASE)


# "3.5", "3/12", "9:30", "2024-05-01": one token each, so "5 mg" after "3.5 mg" is a change.
_NUMBER_JOINT = re.compile(r"(?<=\d)[.,/:\-](?=\d)")
# Words (letters, digits, inner apostrophes), single CJK characters, single symbols (emoji).
_SHINGLE_UNIT = re.compile(f"[{_CJK}]|[^\\W_]+(?:['\u2019][^\\W_]+)*|[^\\w\\s]")


def word_shingles(text: str) -> set[str]:
    """Every word of the text and every pair of neighbouring words, nothing left out: articles,
    pronouns, modal verbs, CJK function characters and emoji count ("was" for "is", "I" for
    "my wife", 下 for 上, 🍌 for 🍓), and so does their order ("Oxford ... Reading" against
    "Reading ... Oxford"). Speaker labels and punctuation do not. What a statement must share
    with an earlier fragment to be a repeat of it."""
    folded = unicodedata.normalize("NFKC", _SPEAKER_LABEL.sub("", text)).casefold()
    units = [
        u
        for u in _SHINGLE_UNIT.findall(_NUMBER_JOINT.sub("x", folded))
        if not unicodedata.category(u[0]).startswith("P")
    ]
    return set(units) | {f"{a} {b}" for a, b in itertools.pairwise(units)}


def fact_tokens(content: str) -> set[str]:
    """A fragment's content tokens without speaker labels, question words and the words of
    reading memory back, negations kept; CJK counts single characters (a bigram across a
    particle, "对芒" in "对芒果过敏", would make a repeat look new), less `_CJK_FUNCTION`."""
    text = _NUMBER_JOINT.sub("x", _CONTRACTED_NOT.sub(" not", _SPEAKER_LABEL.sub("", content)))
    norm = normalise(text)
    raw = [w for w in _WORD.findall(norm) if w not in _STOPWORDS]
    words = {_stem(w) for w in raw if w not in NEGATIONS} - _QUESTION_WORDS - _RECALL_WORDS
    chars = {ch for run in _CJK_RUN.findall(norm) for ch in run} - _CJK_FUNCTION
    return words | (NEGATIONS.intersection(raw)) | chars


def restates(tokens: set[str], earlier: set[str], asking_only: bool) -> bool:
    """Whether a fragment with `tokens` adds nothing to an earlier one with `earlier`.

    `asking_only`: its human side only asks (questions, requests to recall), so the fragment is
    a recall turn, and repeating what memory holds is all it does; judged at any size. A
    fragment that states something is a repeat only when it is long enough to tell.
    """
    if not tokens:
        return asking_only
    if not asking_only and len(tokens) < RESTATED_MIN_TOKENS:
        return False
    return len(tokens & earlier) >= RESTATED_SHARE * len(tokens)


#: A sentence end: Latin punctuation followed by a space (not "3.14"), or a mark that needs none.
_SENTENCE_END = re.compile(r"[.!?…]['\")\]»”’]*\s+|[。！？।؟\n]\s*")
_SPACE = re.compile(r"\s+")


def cut_point(text: str, start: int, end: int, look_back: float = 0.5) -> int:
    """Where to end the piece text[start:end] of a longer text: after the last sentence end in
    its last `look_back` share, else after the last run of spaces there, else at `end` (one
    word longer than a piece). The one cutter of the hand-over's parts
    (middleware/long_turns.py) and of fragments past their byte bound (activities/llm/base.py)."""
    if end >= len(text):
        return len(text)
    low = start + int((end - start) * (1 - look_back))
    window = text[low:end]
    for pattern in (_SENTENCE_END, _SPACE):
        cuts = [m.end() for m in pattern.finditer(window)]
        cuts = [c for c in cuts if c > 0]
        if cuts:
            return low + cuts[-1]
    return end
