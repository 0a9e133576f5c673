"""Merging a profile update into a profile without letting list fields fill with paraphrases.

The predecessor appended whatever the induction LLM returned, so one constraint accumulated 7-14
rewordings ("busy on Wednesdays", "Busy on Wednesdays.", "is busy every Wednesday", ...). Here list
items are de-duplicated exactly (after normalising case, width, punctuation and whitespace) and
semantically, with a deterministic text similarity that needs no model and works for English and
Chinese alike. On a near-duplicate the newest wording wins: a later statement may be a correction
("no longer busy on Wednesdays"), and the user's latest word is the one to trust.

Near-duplicates must say the same thing about the same person (`same_fact`): similar words are
not enough when one item names someone the other does not ("Allergic to peanuts" against
"Husband Tom is allergic to peanuts", 对花生过敏 against 我丈夫对花生过敏, 女儿 against 儿子),
when their numbers differ, or when one negates the other and adds more ("Drinks coffee" against
"Never drinks coffee after dinner"). Those are two facts, and both are kept.
"""

from __future__ import annotations

import re

from mnemoflow.memory.text import content_tokens as _tokens
from mnemoflow.memory.text import normalise
from mnemoflow.models.profile import PROFILE_LIST_FIELDS, UserProfile

#: Single-valued profile fields (everything that is neither a list field nor business_fields).
PROFILE_SCALAR_FIELDS: tuple[str, ...] = tuple(
    name
    for name in UserProfile.model_fields
    if name not in PROFILE_LIST_FIELDS and name != "business_fields"
)


def text_similarity(a: str, b: str) -> float:
    """Similarity in [0, 1]: the overlap coefficient |A & B| / min(|A|, |B|) of content tokens.

    It is a fuzzy containment: 1.0 when one item's content is contained in the other's, and for
    paraphrases that only differ in function words or inflection. Symmetric and deterministic.
    """
    na, nb = normalise(a), normalise(b)
    if na == nb:
        return 1.0 if na else 0.0
    ta, tb = _tokens(na), _tokens(nb)
    if not ta or not tb:
        return 0.0
    return len(ta & tb) / min(len(ta), len(tb))


def _relations(pairs: str) -> dict[str, str]:
    """ "word=canonical word=canonical ..." as a dict (synonyms and plurals to one canonical)."""
    return dict(pair.split("=") for pair in pairs.split())


# Words naming someone other than the user (kin, partners, friends, people at work, pets), each
# mapped to one canonical word so that "mom" and "mother" are one person.
_RELATIONS_EN = _relations(
    "husband=husband hubby=husband wife=wife spouse=spouse partner=partner "
    "boyfriend=boyfriend girlfriend=girlfriend fiance=fiance fiancé=fiance fiancee=fiance "
    "fiancée=fiance son=son sons=son daughter=daughter daughters=daughter child=child "
    "children=child kid=child kids=child baby=baby babies=baby toddler=baby twin=twin twins=twin "
    "mother=mother mom=mother mum=mother mommy=mother mummy=mother mama=mother "
    "father=father dad=father daddy=father papa=father parent=parent parents=parent "
    "brother=brother brothers=brother sister=sister sisters=sister sibling=sibling "
    "siblings=sibling grandmother=grandmother grandma=grandmother granny=grandmother "
    "grandfather=grandfather grandpa=grandfather grandparent=grandparent "
    "grandparents=grandparent grandson=grandchild granddaughter=grandchild "
    "grandchild=grandchild grandchildren=grandchild grandkid=grandchild grandkids=grandchild "
    "aunt=aunt uncle=uncle cousin=cousin cousins=cousin nephew=nephew niece=niece "
    "stepson=son stepdaughter=daughter stepmother=mother stepfather=father "
    "friend=friend friends=friend boss=boss colleague=colleague colleagues=colleague "
    "coworker=colleague coworkers=colleague roommate=roommate flatmate=roommate "
    "housemate=roommate neighbour=neighbour neighbours=neighbour neighbor=neighbour "
    "neighbors=neighbour dog=dog dogs=dog puppy=dog cat=cat cats=cat kitten=cat pet=pet pets=pet"
)
_RELATIONS_ZH = _relations(
    "丈夫=丈夫 老公=丈夫 先生=丈夫 妻子=妻子 老婆=妻子 太太=妻子 媳妇=妻子 爱人=配偶 伴侣=配偶 "
    "男朋友=男朋友 男友=男朋友 女朋友=女朋友 女友=女朋友 未婚夫=未婚夫 未婚妻=未婚妻 "
    "儿子=儿子 女儿=女儿 闺女=女儿 孩子=孩子 小孩=孩子 宝宝=孩子 双胞胎=双胞胎 "
    "妈妈=母亲 母亲=母亲 老妈=母亲 爸爸=父亲 父亲=父亲 老爸=父亲 父母=父母 "
    "哥哥=哥哥 姐姐=姐姐 弟弟=弟弟 妹妹=妹妹 兄弟=兄弟 姐妹=姐妹 "
    "爷爷=爷爷 奶奶=奶奶 外公=外公 外婆=外婆 姥姥=外婆 姥爷=外公 孙子=孙子 孙女=孙女 "
    "外孙=外孙 外孙女=外孙女 叔叔=叔叔 阿姨=阿姨 舅舅=舅舅 姑姑=姑姑 伯伯=伯伯 表哥=表哥 "
    "表姐=表姐 表弟=表弟 表妹=表妹 岳父=岳父 岳母=岳母 公公=公公 婆婆=婆婆 "
    "朋友=朋友 同事=同事 老板=老板 上司=老板 领导=老板 室友=室友 邻居=邻居 同学=同学 "
    "宠物=宠物 小狗=狗 狗狗=狗 小猫=猫 猫咪=猫 "
    "我爸=父亲 我妈=母亲 我哥=哥哥 我姐=姐姐 我弟=弟弟 我妹=妹妹"
)
_RELATION_ZH = re.compile("|".join(sorted(_RELATIONS_ZH, key=len, reverse=True)))
# Capitalised words that are not names: days, months, seasons' holidays.
_NOT_NAMES = frozenset(
    "monday tuesday wednesday thursday friday saturday sunday mondays tuesdays wednesdays "
    "thursdays fridays saturdays sundays mon tue tues wed thu thur thurs fri sat "
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec christmas easter".split()
)
# After a capitalised first word, what makes it a subject (a name) rather than the item's verb
# or adjective: "Tom is allergic", "Mia plays tennis", "Tom's birthday", "Anna: ...".
_SUBJECT_FOLLOWERS = frozenset(
    "is was has had does did doesn't isn't can will would likes loves hates plays works lives "
    "eats drinks prefers enjoys wants needs goes studies attends and also".split()
)
_WORD_AT = re.compile(r"[^\W\d_][\w'\u2019-]*")
# CJK text before a shorter item's whole text that names its subject: 小明 in 小明喜欢游泳. Adverbs
# and the user's own words are no subject.
_ZH_NOT_SUBJECT = re.compile(
    r"^(?:我的?|本人|自己|非常|特别|很|最|也|还|都|一直|经常|总是|比较|真的|超级|平时|现在|已经|"
    r"以前|不再|一般|通常|每天|每周|有时)+$"
)
_CJK_ONLY = re.compile(r"[^\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")

_CONTRACTED_NOT = re.compile(r"n['\u2019]t\b", re.IGNORECASE)
# A negation, and the words a correction adds to the fact it negates ("no longer", "any more").
_NEGATION_WORDS = frozenset("no not never none neither nor without".split())
_CORRECTION_WORDS = _NEGATION_WORDS | _tokens(
    normalise("longer anymore any more now stopped stop quit gave give up")
)
_NEGATION_ZH = re.compile(r"不|没|别|戒|并非|未曾|无法")
_CORRECTION_ZH = frozenset("不没别非未无戒了再已经现在以前曾")


def _names(item: str) -> set[str]:
    """Content tokens of the capitalised words that name someone (or something) in an item:
    not its first word unless a verb or a possessive follows it ("Tom is ...", "Tom's ..."),
    not days and months, not acronyms and not words of a title-cased item."""
    words = list(_WORD_AT.finditer(item))
    if len(words) >= 3 and all(w.group()[0].isupper() for w in words if len(w.group()) > 3):
        return set()  # Title Case: capitals say nothing
    names: set[str] = set()
    for n, match in enumerate(words):
        word = match.group()
        bare = re.sub(r"['\u2019]s$", "", word)
        if not word[0].isupper() or bare.isupper() or bare.casefold() in _NOT_NAMES:
            continue
        if bare.casefold() in _RELATIONS_EN:
            continue
        before = item[: match.start()].rstrip()
        opens = n == 0 or before.endswith((".", "!", "?", ";", "\n"))
        if opens:
            after = item[match.end() :].lstrip()
            following = words[n + 1].group().casefold() if n + 1 < len(words) else ""
            possessive = bare != word
            if not (possessive or after.startswith((":", "(")) or following in _SUBJECT_FOLLOWERS):
                continue
        names |= _tokens(normalise(bare))
    return names


def _people(item: str, tokens: set[str], names: set[str]) -> set[str]:
    """Who an item is about besides the user: its relation words (canonical), and the names
    (found in either item) it holds."""
    norm = normalise(item)
    found = {_RELATIONS_EN[w] for w in norm.split() if w in _RELATIONS_EN}
    found |= {_RELATIONS_ZH[m] for m in _RELATION_ZH.findall(norm)}
    return found | (names & tokens)


def _numbers(tokens: set[str]) -> set[str]:
    return {t for t in tokens if any(ch.isdigit() for ch in t)}


def _zh_subject(a: str, b: str) -> bool:
    """Whether the longer item's CJK text is the shorter one's with a subject before it:
    小明喜欢游泳 against 喜欢游泳 (a name, or anyone but the user)."""
    ca, cb = _CJK_ONLY.sub("", a), _CJK_ONLY.sub("", b)
    short, long = sorted((ca, cb), key=len)
    if not short or short == long or not long.endswith(short):
        return False
    head = long[: -len(short)]
    return not _ZH_NOT_SUBJECT.match(head)


def _negated(item: str) -> bool:
    norm = normalise(_CONTRACTED_NOT.sub(" not", item))
    return bool(_NEGATION_WORDS.intersection(norm.split()) or _NEGATION_ZH.search(norm))


def _correction_extras(a: str, b: str) -> set[str]:
    """What two items, one negating the other, differ in besides the words of negating: their
    non-CJK content tokens and their CJK characters."""
    a, b = _CONTRACTED_NOT.sub(" not", a), _CONTRACTED_NOT.sub(" not", b)
    la, lb = (_tokens(normalise(_CJK.sub(" ", x))) for x in (a, b))
    ca, cb = set(_CJK_ONLY.sub("", a)), set(_CJK_ONLY.sub("", b))
    return ((la ^ lb) - _CORRECTION_WORDS) | ((ca ^ cb) - _CORRECTION_ZH)


def same_fact(a: str, b: str, similarity_threshold: float = 0.8) -> bool:
    """Whether two list items state one fact, so that the newer may replace the older: their
    words are near-duplicates (`text_similarity`), they are about the same people (the same
    relation words and names: "Allergic to peanuts" is not "Husband Tom is allergic to
    peanuts", 女儿 is not 儿子), they hold the same numbers, and if one negates the other it adds
    nothing but the negation ("no longer busy on Wednesdays" corrects "busy on Wednesdays";
    "Never drinks coffee after dinner" is another fact than "Drinks coffee")."""
    if text_similarity(a, b) < similarity_threshold:
        return False
    ta, tb = _tokens(normalise(a)), _tokens(normalise(b))
    if _numbers(ta) != _numbers(tb):
        return False
    names = _names(a) | _names(b)
    if _people(a, ta, names) != _people(b, tb, names) or _zh_subject(a, b):
        return False
    if _negated(a) != _negated(b) and _correction_extras(a, b):
        return False
    return True


def merge_list(
    base: list[str], update: list[str], limit: int, similarity_threshold: float = 0.8
) -> list[str]:
    """Base then update items (oldest to newest), near-duplicates of one fact (`same_fact`)
    collapsed to their newest wording, blanks dropped, bounded to the newest `limit`."""
    merged: list[str] = []
    for raw in [*base, *update]:
        item = " ".join(raw.split())
        if not normalise(item):
            continue
        merged = [m for m in merged if not same_fact(m, item, similarity_threshold)]
        merged.append(item)
    return merged[-limit:]


def merge_profile(
    base: UserProfile,
    update: UserProfile,
    list_limit: int = 12,
    similarity_threshold: float = 0.8,
) -> UserProfile:
    """The profile with the update folded in: non-empty update scalars and business fields win,
    list fields are merged by `merge_list`."""
    if list_limit < 1:
        raise ValueError(f"list_limit must be at least 1, got {list_limit}")
    values: dict[str, object] = {}
    for field in PROFILE_SCALAR_FIELDS:
        new = (getattr(update, field) or "").strip()
        values[field] = new or getattr(base, field)
    for field in PROFILE_LIST_FIELDS:
        values[field] = merge_list(
            getattr(base, field), getattr(update, field), list_limit, similarity_threshold
        )
    business = dict(base.business_fields)
    business.update({k: v for k, v in update.business_fields.items() if v.strip()})
    values["business_fields"] = dict(sorted(business.items()))
    return UserProfile.model_validate(values)
