"""Keyword themes and type rules of the heuristic (offline) memory models, English and Chinese.

These are deliberately generic: each theme is a bag of everyday keywords, a sentence goes to the
theme with most hits, a sentence matching nothing joins its neighbour's theme (or the general
theme), so any conversation slices into something sensible. Nothing is tuned to one dialogue.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

_CJK = re.compile(r"[\u3400-\u9fff]")
# Clause ends: Latin sentence punctuation followed by space (so "3.5" stays whole), CJK sentence
# punctuation and the CJK comma (kept on the clause, so clauses re-join verbatim), line breaks.
# Sentence ends: Latin, Greek (U+037E), Devanagari dandas, Arabic and Urdu, Armenian and
# Ethiopic marks before a space; CJK punctuation at once; line breaks.
_SENTENCE_END = re.compile(
    r"(?<=[.!?;\u037e\u0964\u0965\u061f\u06d4\u0589\u1362\u1367])\s+|(?<=[。！？；，])|\n+"
)
_CJK_PUNCT = tuple("。！？；，")
# Question marks: Latin, CJK fullwidth, Arabic, Greek (U+037E), Ethiopic.
_QUESTION_MARKS = ("?", "？", "\u061f", "\u037e", "\u1367")
# A clause that opens with a pronoun continues the previous clause's topic ("She is three").
_CONTINUATION = re.compile(r"^(?:(?:she|he|it|they|her|his|its|their)\b|[它她他])", re.IGNORECASE)


@dataclass(frozen=True)
class Theme:
    """A theme: its English and Chinese labels and the keywords that vote for it."""

    key: str
    label_en: str
    label_zh: str
    pattern: re.Pattern[str]


def _rx(english: str, chinese: str = "") -> re.Pattern[str]:
    parts = [rf"\b(?:{english})\b"]
    if chinese:
        parts.append(f"(?:{chinese})")
    return re.compile("|".join(parts), re.IGNORECASE)


# Order matters only to break ties (earlier wins), so specific themes come first.
THEMES: tuple[Theme, ...] = (
    Theme(
        "pets",
        "pets",
        "宠物",
        _rx(
            r"pets?|dogs?|cats?|pupp(?:y|ies)|kittens?|parrots?|hamsters?|rabbits?|bunny|"
            r"goldfish|turtles?|vet|walk(?:ing)? the dog",
            r"宠物|狗|猫|兔子|鹦鹉|仓鼠|金鱼|乌龟|遛狗|兽医",
        ),
    ),
    Theme(
        "orders",
        "orders & payment",
        "订单与支付",
        _rx(
            r"orders?|refunds?|returns?|payments?|pay|paid|cards?|credit|debit|visa|mastercard|"
            r"invoices?|receipts?|shipping|shipped|delivery|package|parcel|tracking|purchased?|"
            r"bought|price|charged?|coupon|discount|ending in|last (?:four|4) digits|booking|"
            r"booked|reservation|reserved|confirmation|tickets?|subscription",
            r"订单|退款|退货|支付|付款|付钱|银行卡|信用卡|卡号|尾号|发票|快递|物流|包裹|购买|下单|价格|优惠|预订|订票|机票",
        ),
    ),
    Theme(
        "devices",
        "devices",
        "设备",
        _rx(
            r"phones?|iphone|android|samsung|galaxy|pixel|huawei|xiaomi|redmi|oneplus|oppo|vivo|"
            r"laptops?|tablets?|ipad|computers?|macbook|devices?|battery|screen|charger|headphones?|"
            r"earbuds|smartwatch|model",
            r"手机|电脑|笔记本|平板|型号|设备|屏幕|电池|充电|耳机|手表|华为|小米|苹果|荣耀|红米",
        ),
    ),
    Theme(
        "address",
        "address",
        "地址",
        _rx(
            r"address|live (?:in|at|on)|moved to|street|st|road|rd|avenue|ave|apt|apartment|"
            r"suite|zip|postcode|postal|ship (?:it )?to|deliver (?:it )?to",
            r"地址|住址|住在|搬到|小区|邮编|号楼|单元|[路街道]\d+号",
        ),
    ),
    Theme(
        "schedule",
        "schedule & availability",
        "时间安排",
        _rx(
            r"mondays?|tuesdays?|wednesdays?|thursdays?|fridays?|saturdays?|sundays?|weekdays?|"
            r"weekends?|busy|free|available|availability|schedule|meetings?|appointments?|"
            r"mornings?|afternoons?|evenings?|tonight|tomorrow|\d{1,2}(?::\d\d)?\s*(?:am|pm)|"
            r"o'clock",
            r"周[一二三四五六日天末]|星期|礼拜|忙|有空|空闲|没空|上午|下午|晚上|早上|明天|预约|会议|\d+点",
        ),
    ),
    Theme(
        "identity",
        "identity & contact",
        "身份与联系方式",
        _rx(
            r"my name|name is|call me|years old|born|birthday|i work as|my job|occupation|"
            r"profession|email|e-mail|phone number|mobile number|wechat|contact",
            r"我叫|名字|姓名|我姓|生日|出生|岁|职业|工作是|邮箱|微信|电话|手机号|联系方式",
        ),
    ),
    Theme(
        "preferences",
        "preferences",
        "偏好",
        _rx(
            r"like|likes|love|loves|prefer|prefers|preferred|favou?rite|enjoy|enjoys|hate|"
            r"dislike|fan of|hobby|hobbies|food|eat|dish|cuisine|taste",
            r"喜欢|爱吃|最爱|偏好|讨厌|爱好|兴趣|口味|好吃",
        ),
    ),
    Theme(
        "relationships",
        "family & relationships",
        "家人与关系",
        _rx(
            r"wife|husband|partner|son|daughter|kids?|children|mother|mom|mum|father|dad|"
            r"parents?|brother|sister|friend|boyfriend|girlfriend|family",
            r"老婆|妻子|丈夫|老公|儿子|女儿|孩子|妈妈|母亲|爸爸|父亲|父母|哥哥|姐姐|弟弟|妹妹|朋友|家人",
        ),
    ),
    Theme(
        "goals",
        "goals & plans",
        "目标与计划",
        _rx(
            r"goal|plan|plans|planning|want to|hope to|trying to|learn|learning|project|deadline|"
            r"career|exam",
            r"目标|计划|打算|希望|想要|学习|项目|考试|截止",
        ),
    ),
)
GENERAL = Theme("general", "general", "日常", re.compile(r"(?!x)x"))

TYPE_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "identity",
        re.compile(
            r"(?i:\b(?:my name|name is|call me|years old|born|birthday|i work as|occupation|"
            r"profession)\b)|\b(?:I'm|I am|i'm|i am) (?:(?i:an?) |[A-Z])|"
            # "\d岁", not "\d+岁": only whether it occurs is asked, and a bounded match
            # keeps `types_of_repeats` exact (TYPE_REACH).
            r"我叫|我是|名字|我姓|生日|出生|\d岁|职业",
        ),
    ),
    (
        "preference",
        _rx(
            r"like|likes|love|loves|prefer|prefers|favou?rite|enjoy|enjoys|hate|dislike|"
            r"can't stand|fan of",
            r"喜欢|爱吃|最爱|偏好|讨厌|爱好",
        ),
    ),
    (
        "decision",
        _rx(
            r"decide|decided|will|i'll|we'll|going to|gonna|plan to|choose|chose|let's|go with",
            r"决定|打算|准备|选择|就选|我会|我要",
        ),
    ),
    (
        "fact",
        _rx(
            r"order|card|address|phone|model|number|email|account|called|named|code|my (?:wife|"
            r"husband|partner|son|daughter|mother|mom|father|dad|brother|sister|friend|boss|dog|cat)",
            r"\d|订单|卡|地址|手机|型号|号码|邮箱|账号|叫",  # any digit: numbers are concrete facts
        ),
    ),
    (
        "episode",
        _rx(
            r"yesterday|last (?:week|month|year|night|time|weekend)|ago|went|happened|visited|"
            r"arrived|broke|lost|used to|was|were",
            r"昨天|前天|上周|上个月|去年|以前|曾经|那次|之前",
        ),
    ),
)

#: Non-ASCII characters the theme and type patterns name (their Chinese keywords).
_KEYWORD_CHARS = frozenset(
    char
    for pattern in (*(t.pattern for t in THEMES), *(p for _, p in TYPE_RULES))
    for char in pattern.pattern
    if not char.isascii()
)
# Stand-ins for characters no keyword pattern can take in: one that \b counts as a word
# character (as CJK is), one it does not (as emoji are). Both are themselves inert.
_INERT_WORD, _INERT_OTHER = "\u4e02", "\ufffc"


def _takeable(char: str) -> bool:
    """Whether some keyword pattern might consume `char` (erring towards yes): ASCII, digits,
    spaces, the keywords' own characters, and anything with case (IGNORECASE lets "ſ" match
    "s" and "K" match "k")."""
    if char.isascii() or char.isspace() or char.isnumeric() or char in _KEYWORD_CHARS:
        return True
    variants = char.lower() + char.upper() + char.casefold() + char.title()
    return variants != char * 4 or any(v.isascii() or v in _KEYWORD_CHARS for v in variants)


class _Inert(dict[int, int]):
    """str.translate table: a character no keyword pattern can take in becomes its stand-in,
    every other stays; each character is classified once, then cached."""

    def __missing__(self, code: int) -> int:
        char = chr(code)
        if _takeable(char):
            kept = code
        else:
            kept = ord(_INERT_WORD if char.isalnum() else _INERT_OTHER)
        if len(self) < 65536:
            self[code] = kept
        return kept


_INERT = _Inert()
_INERT_RUN = re.compile(f"[{_INERT_WORD}{_INERT_OTHER}]{{3,}}")
assert not {_INERT_WORD, _INERT_OTHER} & _KEYWORD_CHARS


def keyword_view(text: str) -> str:
    """`text` with each run of characters no keyword pattern can take in cut to its first and
    last (as stand-ins): every theme and type pattern finds the same matches in it, since a
    match never holds such a character, and the only context a pattern reads around a match
    (\b) is whether the next character is a word character. Emoji and most CJK are such
    characters, so a Chinese or emoji-heavy message shrinks several times before nine theme
    patterns scan it (they cost ~3 us a character: the bulk of slicing a long round)."""
    if text.isascii():  # nothing ASCII is inert
        return text
    return _INERT_RUN.sub(_ends, text.translate(_INERT))


def _ends(run: re.Match[str]) -> str:
    return run[0][0] + run[0][-1]


_STOPWORDS = frozenset(
    "about after again also because been before being could does doing from have having here "
    "just know like more much need only other over really some than that their them then there "
    "these they thing think this those very want what when where which while will with would "
    "your yours maybe please thanks thank okay sure right well good great everything something "
    "anything nothing".split()
)
_WORD = re.compile(r"\b[A-Za-z][A-Za-z-]{3,}\b(?!')")


def split_sentences(text: str) -> list[str]:
    """Sentences (CJK: clauses) of a message, stripped, verbatim otherwise."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


_QUESTION_EN = re.compile(
    r"^(?:what|when|where|who|whom|whose|which|why|how|do|does|did|can|could|would|will|shall|"
    r"should|is|are|am|was|were|have|has|had|may|might)\b(?:\s+\S+){1,}",
    re.IGNORECASE,
)
_QUESTION_ZH = re.compile(
    r"(?:吗|呢|么|嘛)\s*[。.!！]?$|什么|哪|谁|怎么|多少|几点|几号|为何|为什么|是否|"
    r"([\u4e00-\u9fff])[不没]\1"
)
# Question words that do not ask: "不怎么" (not much), "什么都" (anything), "谁也" (nobody).
_ZH_INDEFINITE = re.compile(
    r"[不没]怎么|没什么|什么[都也]|谁[都也]|哪[儿里]?[都也]|怎么[都也]|多少有点|多多少少"
)
# Requests to recall ("remind me what I ordered", "你还记得我的生日吗"): asking, not stating.
_RECALL_REQUEST = re.compile(
    r"^(?:(?:hey|so|ok(?:ay)?|and|please|now)[\s,]+)*(?:(?:can|could|would) you\s+)?(?:please\s+)?"
    r"(?:tell me|remind me (?:of|what|when|where|which|who|how|about)|do you (?:still )?"
    r"(?:know|remember|recall)|(?:what|where|when|who|how)'s)\b|"
    r"^(?:请)?(?:告诉我|提醒我|你(?:还)?记得|还记得|你知道)",
    re.IGNORECASE,
)


def is_question(sentence: str) -> bool:
    """A sentence that asks rather than states: it ends with a question mark, opens with an
    interrogative or auxiliary (English), or carries a question word or particle (Chinese,
    unless it ends as a statement with 。), or asks to be reminded ("tell me my order number",
    "你还记得我的生日"). Asking is never stating a fact about oneself."""
    text = sentence.strip()
    if not text:
        return False
    if text.endswith(_QUESTION_MARKS):
        return True
    if _QUESTION_EN.match(text) and not text.endswith("."):
        return True
    if _RECALL_REQUEST.match(text):
        return True
    return bool(_QUESTION_ZH.search(_ZH_INDEFINITE.sub("", text))) and not text.endswith("。")


def bounded_pieces(text: str, bound: int, units: Callable[[str], int], per_token: int) -> list[str]:
    """`text` cut into verbatim pieces of at most `bound` tokens, a text's tokens being its
    `units` over `per_token`, rounded up (`memory.text.token_units`: units must add up over
    concatenation): whole sentences where they fit, else words, else characters (a script
    written without spaces, a run-on line); joined again they give the text back, up to the
    whitespace between pieces. Each piece's units are carried along rather than counted again
    as it grows, so this is linear in the text (re-counting a growing piece made a long
    unpunctuated turn quadratic)."""
    limit = bound * per_token  # ceil(u / per_token) <= bound  <=>  u <= bound * per_token
    space = units(" ")
    pieces: list[str] = []
    sizes: list[int] = []
    for sentence in split_sentences(text):
        for part, size in _cut(sentence, limit, units, space):
            if pieces:
                gap = 0 if not pieces[-1] or pieces[-1].endswith(_CJK_PUNCT) else space
                joined = sizes[-1] + size + gap
                if joined <= limit:
                    pieces[-1] = join_sentences(pieces[-1], part)
                    sizes[-1] = joined
                    continue
            pieces.append(part)
            sizes.append(size)
    return pieces


def _cut(
    sentence: str, limit: int, units: Callable[[str], int], space: int
) -> list[tuple[str, int]]:
    """A sentence as parts within `limit` units, each with its units."""
    size = units(sentence)
    if size <= limit:
        return [(sentence, size)]
    out: list[tuple[str, int]] = []
    for word in sentence.split():
        word_size = units(word)
        parts = [(word, word_size)] if word_size <= limit else _chars(word, limit, units)
        for part, part_size in parts:
            if out and out[-1][1] + space + part_size <= limit:
                out[-1] = (f"{out[-1][0]} {part}", out[-1][1] + space + part_size)
            else:
                out.append((part, part_size))
    return out


def _chars(word: str, limit: int, units: Callable[[str], int]) -> list[tuple[str, int]]:
    """The word cut between characters, each part as many characters as fit (at least one)."""
    per_char = {char: units(char) for char in set(word)}
    ends = list(accumulate(map(per_char.__getitem__, word), initial=0))  # strictly rising
    out: list[tuple[str, int]] = []
    start = 0
    while start < len(word):
        stop = max(bisect_right(ends, ends[start] + limit) - 1, start + 1)
        out.append((word[start:stop], ends[stop] - ends[start]))
        start = stop
    return out


def join_sentences(previous: str, sentence: str) -> str:
    """Re-join clauses the way they were written (no space after CJK punctuation)."""
    if not previous:
        return sentence
    return previous + ("" if previous.endswith(_CJK_PUNCT) else " ") + sentence


def themes_of(sentences: list[str]) -> list[Theme]:
    """The theme of each sentence of one message. Sentences without keywords (and ones opening
    with a pronoun) take the topic of their neighbour in the same message: a message rarely
    changes subject mid-thought, and "你好，" should not become a fragment of its own."""
    themes = [theme_of(s) for s in sentences]
    for i in range(1, len(themes)):
        if _CONTINUATION.match(sentences[i]) and themes[i - 1] is not GENERAL:
            themes[i] = themes[i - 1]
    for i, theme in enumerate(themes):
        if theme is GENERAL:
            before = [t for t in themes[:i] if t is not GENERAL]
            after = [t for t in themes[i + 1 :] if t is not GENERAL]
            themes[i] = before[-1] if before else (after[0] if after else GENERAL)
    return themes


def theme_of(sentence: str) -> Theme:
    """The theme with most keyword hits; ties go to the earlier (more specific) theme."""
    best, best_hits = GENERAL, 0
    view = keyword_view(sentence)
    for theme in THEMES:
        hits = len(theme.pattern.findall(view))
        if hits > best_hits:
            best, best_hits = theme, hits
    return best


def types_of(text: str) -> list[str]:
    """Fragment types the text shows evidence of; plain chat when none."""
    found = [name for name, pattern in TYPE_RULES if pattern.search(text)]
    return found or ["chat"]


#: No match of a TYPE_RULES pattern, with the character on either side that `\b` looks at, is
#: longer than this (tests/activities/test_heuristic_scaling.py checks it against the patterns).
TYPE_REACH = 64


def repeated(runs: Sequence[tuple[str, int]]) -> str:
    """The runs' texts, each `count` times, joined by spaces."""
    return " ".join(" ".join([text] * count) for text, count in runs)


def types_of_repeats(runs: Sequence[tuple[str, int]]) -> list[str]:
    """`types_of(repeated(runs))` without searching every repeat. A text of at least TYPE_REACH
    characters repeated three or more times is searched twice over: "s s" holds every match
    "s s s ..." does (a match is too short to span two joins, so it lies in two neighbouring
    copies), and gives no new one. (A long turn cut into 50 pieces carried its text 50 times
    into its fragment's search, and a round of long turns took most of a minute.) Each text is
    searched as its `keyword_view`, which joins the same way (a space is never inert)."""
    views = [(keyword_view(text), count) for text, count in runs]
    return types_of(
        " ".join(
            " ".join([view] * (min(count, 2) if len(view) >= TYPE_REACH else count))
            for view, count in views
        )
    )


def is_mostly_chinese(text: str) -> bool:
    """True when CJK characters outnumber Latin words (then Chinese theme labels read better)."""
    return len(_CJK.findall(text)) > len(_WORD.findall(text))


def theme_label(theme: Theme, text: str) -> str:
    """A readable theme label; the general theme names its most frequent content words."""
    chinese = is_mostly_chinese(text)
    label = theme.label_zh if chinese else theme.label_en
    if theme is not GENERAL or chinese:
        return label
    counts = Counter(w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS)
    return _general_label(label, counts)


def _general_label(label: str, counts: Counter[str]) -> str:
    # most_common keeps first-seen order among equal counts, so this is deterministic.
    top = [word for word, _ in counts.most_common(2)]
    return f"{label}: {', '.join(top)}" if top else label


def theme_label_repeats(theme: Theme, runs: Sequence[tuple[str, int]]) -> str:
    """`theme_label(theme, repeated(runs))`, counting each text once and multiplying: neither
    CJK characters nor Latin words reach across the spaces that join the copies."""
    cjk = words = 0
    for text, count in runs:
        cjk += count * len(_CJK.findall(text))
        words += count * len(_WORD.findall(text))
    chinese = cjk > words
    label = theme.label_zh if chinese else theme.label_en
    if theme is not GENERAL or chinese:
        return label
    counts: Counter[str] = Counter()
    for text, count in runs:
        once = Counter(w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS)
        for word, hits in once.items():  # in first-seen order, as one pass over the whole
            counts[word] += hits * count
    return _general_label(label, counts)
