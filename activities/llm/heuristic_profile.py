"""Regex profile extraction for the heuristic inducer (English and Chinese).

Only the human's lines are read (an assistant line is a paraphrase at best). Patterns are generic
shapes of how people state facts about themselves ("my X is Y", "I'm busy on ...", "我叫...",
"尾号..."), so they work on conversations nobody wrote them for; anything they miss simply stays in
the fragments, which are still retrieved and injected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from mnemoflow.activities.llm.heuristic_rules import is_question, split_sentences
from mnemoflow.models.profile import UserProfile

_I = re.IGNORECASE
_END = r"(?=[,.;!?，。；！？、]|\s+(?:and|but|so|because)\b|$)"
_ZH_END = r"(?=[，,。.;；!！?？、\s]|$)"
# Where a stated value ends: sentence punctuation or the next comma-separated clause.
_VALUE_END = r"(?=[;!?。；！？]|,\s|\.(?:\s|$)|$)"
_CLAUSE = re.compile(r",\s*(?=(?:but|and|so|though|although|except)\b)|;\s*", re.IGNORECASE)
_LEAD = re.compile(
    r"^(?:(?:and|but|also|so|well|oh|i'm|i am|i'll be|usually)\b[\s,]*|我|一般|通常)+", _I
)

_NAME = (
    re.compile(r"\bmy name is ([A-Z][\w'-]+(?: [A-Z][\w'-]+)?)"),
    re.compile(r"\b(?:call me|I'm|I am) ([A-Z][a-z'-]+(?: [A-Z][a-z'-]+)?)" + _END),
    re.compile(r"(?:我叫|我的名字是|我的名字叫|名字叫)([\u4e00-\u9fff·]{2,4}?)" + _ZH_END),
)
_NOT_NAMES = frozenset({"Not", "Just", "Sorry", "Fine", "Good", "Here", "Back", "Busy", "Free"})
_JOB_WORD = (
    r"(?:\w+(?:er|or|ist|ian|ant|ent|eer|ect|nurse|chef|student|analyst|lawyer|clerk|pilot))"
)
_OCCUPATION = (
    re.compile(
        r"\b(?:I work as|my job is|my occupation is|my profession is) (?:an? )?([\w -]{3,40}?)"
        + _END,
        _I,
    ),
    re.compile(rf"\b(?:I'm|I am) (?:an? )((?:\w+ )?{_JOB_WORD})\b", _I),
    re.compile(
        r"(?:我是|职业是|我当|^是|[，,]是)(?:一名|一个|个)?([\u4e00-\u9fff]{0,6}?"
        r"(?:工程师|程序员|设计师|老师|教师|医生|护士|律师|会计|经理|学生|司机|厨师|作家|记者|店主|老板|销售|"
        r"员|师|家))" + _ZH_END
    ),
)
_ACTIVITIES_ZH = (
    "游泳|跑步|爬山|徒步|钓鱼|摄影|画画|绘画|阅读|看书|唱歌|跳舞|篮球|足球|羽毛球|乒乓球|网球|瑜伽|健身|骑行|"
    "旅游|旅行|下棋|钢琴|吉他|做饭|烘焙|编程|打游戏|滑雪|露营|养花|书法"
)
_HOBBY = (
    re.compile(r"\bmy hobb(?:y is|ies are) ([\w ,'-]{3,60}?)" + _END, _I),
    re.compile(r"\bI (?:really )?(?:like|love|enjoy) (\w+ing(?: \w+)?)" + _END, _I),
    re.compile(r"(?:爱好是|喜欢|爱)(" + _ACTIVITIES_ZH + ")"),
)
_INTEREST = (
    re.compile(r"\b(?:I'm|I am) (?:really |very )?interested in ([\w ,'-]{3,60}?)" + _END, _I),
    re.compile(r"\bI'm (?:a big |a huge )?fan of ([\w ,'-]{3,60}?)" + _END, _I),
    re.compile(r"对([\u4e00-\u9fff\w]{2,12}?)(?:很|非常|比较)?感兴趣"),
)
_FOOD = (
    re.compile(r"\bfavou?rite (?:food|dish|meal|snack) is ([\w ,'-]{2,60}?)" + _END, _I),
    re.compile(r"\bI (?:really )?(?:love|like) (?:eating|to eat) ([\w ,'-]{2,60}?)" + _END, _I),
    re.compile(
        r"(?:最喜欢吃|最爱吃|爱吃|最喜欢的食物是|最喜欢的菜是)([\u4e00-\u9fff\w]{1,12}?)" + _ZH_END
    ),
)
_CONSTRAINT = re.compile(
    r"\b(?:busy|not available|unavailable|can't|cannot|can not|allergic|allergy|"
    r"only (?:on|after|before)|don't call|do not call|never on|budget)\b|"
    r"忙|没空|不方便|过敏|不能|只能|预算|别打电话",
    _I,
)
_GOAL = (
    re.compile(
        r"\b(?:I want to|I'd like to|I hope to|I plan to|I'm planning to|I'm trying to|"
        r"my goal is(?: to)?) ([\w ,'-]{3,80}?)" + _END,
        _I,
    ),
    re.compile(
        r"(?:我的目标是|目标是|我希望|我打算|我计划|我想要)([\u4e00-\u9fff\w]{2,30}?)" + _ZH_END
    ),
)
_PET_EN = r"dog|cat|puppy|kitten|parrot|hamster|rabbit|bunny|turtle|goldfish|pet"
_KIN_EN = (
    r"wife|husband|partner|son|daughter|mother|mom|mum|father|dad|brother|sister|"
    r"boyfriend|girlfriend|friend"
)
_KIN_ZH = r"狗|猫|兔子|鹦鹉|仓鼠|金鱼|乌龟|小狗|小猫|老婆|老公|妻子|丈夫|儿子|女儿"
_NAMED = r"(?:'s name is| is called| is named| named| called|,)?"
_MONTH_DAY = r"[A-Z][a-z]+ \d{1,2}(?:st|nd|rd|th)?|\d{1,2}(?:st|nd|rd|th)? (?:of )?[A-Z][a-z]+"
_DATE = (
    rf"(?:{_MONTH_DAY})(?:,? \d{{4}})?|\d{{4}}-\d{{2}}-\d{{2}}|\d{{1,2}}/\d{{1,2}}(?:/\d{{2,4}})?"
)
_BRAND = (
    r"iPhone|Samsung Galaxy|Galaxy|Pixel|Huawei|Xiaomi|Redmi|OnePlus|OPPO|Oppo|vivo|Vivo|Honor|"
    r"Nokia|Motorola|Moto"
)
_MODEL_WORD = r"[A-Z]?\d+[A-Za-z+]*|Pro|Max|Ultra|Plus|Mini|mini|Lite|Mate|Note|[A-Z]\d*"
_SHIP_TO = r"my address is|I live at|ship (?:it )?to|deliver (?:it )?to|send (?:it )?to"
_TIME_WORD = r"on|from|between|after|before|in|at|during|every"
_RELATION = (
    re.compile(rf"\b(?:[Mm]y|[Oo]ur) ({_PET_EN}|{_KIN_EN}){_NAMED} ([A-Z][a-z'-]+)\b"),
    re.compile(rf"\bI have an? ({_PET_EN}) (?:named|called) ([A-Z][a-z'-]+)\b", _I),
    re.compile(rf"\b(?P<who>[A-Z][a-z'-]+),? (?:the|our|my) (?P<kind>{_PET_EN})\b"),
    re.compile(
        rf"(?:我家|我的|我)?(?:有一只|有只|养了一只|养了只|的)?({_KIN_ZH})(?:的名字)?(?:叫|是)"
        r"([\u4e00-\u9fff\w]{1,4}?)" + _ZH_END
    ),
)
_PETS = frozenset(_PET_EN.split("|")) | frozenset(
    "狗 猫 兔子 鹦鹉 仓鼠 金鱼 乌龟 小狗 小猫".split()
)

_BUSINESS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "order_number",
        re.compile(
            r"\border\s*(?:number|no\.?|#|id)?\s*(?:is|:|was)?\s*#?([A-Z0-9][A-Z0-9-]*\d[A-Z0-9-]*)",
            _I,
        ),
    ),
    ("order_number", re.compile(r"订单号?(?:是|为|：|:)?\s*([A-Za-z0-9-]*\d[A-Za-z0-9-]{2,})")),
    (
        "card_tail",
        re.compile(
            r"\b(?:card )?(?:ending|ends) (?:in|with) (\d{4})\b|"
            r"\blast (?:four|4) digits[\w ]*? (?:are|is) (\d{4})\b",
            _I,
        ),
    ),
    ("card_tail", re.compile(r"尾号(?:是|为)?\s*(\d{4})")),
    (
        "birthday",
        re.compile(rf"\bbirthday(?: is|'s)?(?: on)? ({_DATE})"),
    ),
    ("birthday", re.compile(r"生日(?:是|在)?\s*((?:\d{4}年)?\d{1,2}月\d{1,2}[日号]?)")),
    (
        "phone_model",
        re.compile(rf"\b((?:{_BRAND})(?: ?(?:{_MODEL_WORD})){{1,3}})"),
    ),
    (
        "phone_model",
        re.compile(
            r"((?:华为|小米|苹果|荣耀|红米|三星)\s?[A-Za-z]*\s?\d+\s?(?:Pro|Max|Ultra|Plus)?)"
        ),
    ),
    (
        "address",
        re.compile(
            rf"\b(?:{_SHIP_TO}) (.{{6,120}}?)(?=[;!?]|\.(?:\s|$)|$)",
            _I,
        ),
    ),
    (
        "address",
        re.compile(r"(?:地址是|地址：|地址:|住在|住址是)\s*(.{4,60}?)" + r"(?=[。！？；;!?]|$)"),
    ),
    (
        "free_time",
        re.compile(
            r"\b(?:I'm |I am )?(?:usually |only )?(?:free|available|reachable)\s+"
            rf"((?:{_TIME_WORD})\b.{{2,60}}?)" + _VALUE_END,
            _I,
        ),
    ),
    ("free_time", re.compile(r"\bmy free time is (.{2,60}?)" + _VALUE_END, _I)),
    ("free_time", re.compile(r"([^，。！？\s]{2,20}?)(?:有空|比较闲|空闲)")),
    ("favourite_food", _FOOD[0]),
    ("favourite_food", _FOOD[1]),
    ("favourite_food", _FOOD[2]),
    ("email", re.compile(r"\b([\w.+-]+@[\w-]+\.[\w.-]+)\b")),
)


# A fragment line: `User: ...`, `User (Caroline): ...`, `Assistant (Mel): ...`.
_SPEAKER = re.compile(r"^(User|Assistant)(?: \([^)\n]*\))?:")


def _human_sentences(contents: Iterable[str]) -> list[str]:
    sentences: list[str] = []
    for content in contents:
        human = False
        for line in content.splitlines():
            speaker = _SPEAKER.match(line)
            if speaker is not None:  # else a continuation line of the same speaker
                human = speaker.group(1) == "User"
                line = line[speaker.end() :]
            if human:
                # Questions ("What am I allergic to?") ask about facts, they never state one.
                sentences.extend(s for s in split_sentences(line.strip()) if not is_question(s))
    return sentences


def _first(patterns: Iterable[re.Pattern[str]], text: str) -> str | None:
    for pattern in patterns:
        for match in pattern.finditer(text):
            value = next((g for g in match.groups() if g), "").strip()
            if value and value not in _NOT_NAMES:
                return value
    return None


def _add(items: list[str], value: str | None) -> None:
    if value and value not in items:
        items.append(value)


def extract_profile(contents: Iterable[str]) -> UserProfile:
    """A profile update holding only what the human lines state outright."""
    update = UserProfile()
    for sentence in _human_sentences(contents):
        update.name = update.name or _first(_NAME, sentence)
        update.occupation = update.occupation or _first(_OCCUPATION, sentence)
        _add(update.hobbies, _first(_HOBBY, sentence))
        _add(update.interests, _first(_INTEREST, sentence))
        _add(update.goals, _first(_GOAL, sentence))
        for clause in _CLAUSE.split(sentence):
            if _CONSTRAINT.search(clause):
                # The clause as the human said it: paraphrasing is where details get lost.
                text = _LEAD.sub("", clause.rstrip(".!。！，,")).strip()
                _add(update.constraints, text or None)
        for pattern in _RELATION:
            for match in pattern.finditer(sentence):
                named = match.groupdict()
                kind, who = (named["kind"], named["who"]) if named else match.groups()
                label = f"pet {kind}" if kind.lower() in _PETS else kind
                _add(update.relationships, f"{label}: {who}")
                if kind.lower() in _PETS:
                    update.business_fields.setdefault("pet_name", who)
        found: dict[str, str] = {}
        for key, pattern in _BUSINESS:
            hit = None if key in found else pattern.search(sentence)
            value = next((g for g in hit.groups() if g), "") if hit else ""
            value = _LEAD.sub("", value.strip()).strip()
            if value:
                found[key] = value
        # A later statement corrects an earlier one ("sorry, the order is 4471").
        update.business_fields.update(found)
    return update
