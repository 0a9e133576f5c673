"""Regex profile extraction for the heuristic inducer (English and Chinese).

Only the human's lines are read (an assistant line is a paraphrase at best), and only the
sentences that state something: a question ("What am I allergic to?", "我女儿叫什么名字？") or a
request to recall ("remind me what I ordered") asks about a fact and never becomes one.

There is no list of fields. The patterns are the generic shapes in which people state facts about
themselves, and the field is named with the speaker's own words:

- "my X is Y", "the X is Y", "my X, which is on Y" (English), "我的X是Y", "X尾号Y" (Chinese),
  kept when Y is a concrete value (a number, a date, a name, an address), or for any Y when X is
  a favourite ("my favourite band is the national"): business_fields[X] = Y;
- "X ending in 1234", "I was born on ...", addresses, emails and availability windows, which
  have fixed shapes in any conversation;
- name, occupation, hobbies, likes and interests, goals;
- constraints: allergies, dislikes, what one cannot do or when one is busy, as the clause was said;
- people and pets: "my sister Anna", "Anna is my sister", "my dog's name is Rex", "我女儿叫小雨".

What a sentence does not state is never kept (docs/ARCHITECTURE.md, offline models):

- asking and doubting: besides `is_question`, an inverted "Am I / Is my ... ." even without its
  question mark, Chinese A-not-A forms (是不是, 能不能, 有没有) and 是否/能否, and hedges
  ("I wonder if", "not sure whether", "can you check whether", 不确定, 帮我查): the sentence is
  kept only up to the hedge, a Chinese clause with an A-not-A form is dropped, and the clauses
  after a hedged one in the same sentence go with it;
- a negated like ("I don't love", "It's not that I love", 不太喜欢, 没那么喜欢, 不再喜欢) is
  never a hobby, interest, favourite or free time; where it is a dislike it is a constraint
  in the speaker's words, negation included;
- another person's detail ("my wife's favourite band", "Anna's email", 我儿子的邮箱) is not the
  speaker's: it goes to relationships as "wife's favourite band: Coldplay";
- a nationality, faith, diet or habit ("I'm Italian", "I'm a vegetarian", "a former smoker")
  is neither a name nor an occupation (a diet is a constraint).

A correction states the new value, so the stale one leaves the profile when induction merges
the update (memory.profile_merge): a move gives the address moved to ("I moved from 12 Elm Street
to 14 Elm Street", "我搬到了..."), "my new X is" states X, a job taken up after another ("I'm a
paramedic now", "I became a", "现在是律师", "转行当了") is the occupation (the latest statement
wins), and a diet given up ("no longer vegan", "not a vegetarian anymore") is a constraint of its
own that replaces the diet in the merge.

Anything they miss stays in the fragments, which are still retrieved and injected.
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
# Where a stated value ends when a comma may belong to it ("42 Maple Street, Springfield").
_LONG_VALUE_END = r"(?=[;!?。；！？]|\.(?:\s|$)|\s+(?:and|but|so|because|since|though)\s|$)"
_CLAUSE = re.compile(
    r",\s*(?=(?:but|and|so|though|although|except)\b)|\s+(?=(?:but|though|although)\b)|;\s*",
    re.IGNORECASE,
)
_LEAD = re.compile(
    r"^(?:(?:and|but|also|so|well|oh|i'm|i am|i'll be|i|usually)\b[\s,]*|我|一般|通常)+", _I
)

_NAME = (
    re.compile(r"\b(?i:my name is) ([A-Z][\w'-]+(?: [A-Z][\w'-]+)?)"),
    re.compile(r"\b(?:[Cc]all me|I'm|I am) ([A-Z][a-z'-]+(?: [A-Z][a-z'-]+)?)" + _END),
    # The speaker's own name only: not "她的名字叫小雨", "我家狗名字叫旺财".
    re.compile(
        r"(?:我叫|我的名字(?:是|叫)|我名字叫|(?<![\u4e00-\u9fff])名字(?:是|叫))"
        r"([\u4e00-\u9fff·]{2,4}?)" + _ZH_END
    ),
)
_NOT_NAMES = frozenset({"Not", "Just", "Sorry", "Fine", "Good", "Here", "Back", "Busy", "Free"})
# What one is rather than who: nationality, language, faith, diet, identity ("I'm Italian").
# A closed class of everyday words, plus the -ese/-ish adjectives (Japanese, Danish).
_IDENTITY_WORDS = frozenset(
    """american british english irish scottish welsh canadian australian mexican brazilian
    argentinian argentine chilean peruvian colombian cuban venezuelan puerto french german
    italian spanish portuguese dutch belgian swiss austrian swedish norwegian danish finnish
    icelandic polish czech slovak hungarian romanian bulgarian greek turkish russian ukrainian
    serbian croatian bosnian slovenian albanian estonian latvian lithuanian chinese japanese
    korean vietnamese thai filipino filipina indonesian malaysian singaporean indian pakistani
    bangladeshi nepali nepalese tibetan mongolian iranian persian iraqi israeli palestinian
    lebanese syrian jordanian saudi emirati arab egyptian moroccan algerian tunisian nigerian
    kenyan ethiopian ghanaian somali sudanese african asian european latino latina latinx
    hispanic caribbean jamaican haitian taiwanese cantonese kiwi aussie jewish muslim
    catholic protestant orthodox buddhist hindu sikh mormon atheist agnostic vegan vegetarian
    pescatarian gay lesbian bisexual queer trans straight black white""".split()
)
_IDENTITY_SUFFIX = re.compile(r"^\w{3,}(?:ese|ish)$", _I)


def _is_identity(word: str) -> bool:
    head = word.split()[0].lower() if word.split() else ""
    return head in _IDENTITY_WORDS or bool(_IDENTITY_SUFFIX.match(head))


# A habit, diet, belief, status or relation one has, not a job one does ("a former smoker",
# "a dog lover", "a perfectionist"); and a job no longer held ("a former nurse").
_NOT_JOBS = frozenset(
    """smoker non-smoker drinker eater sleeper riser lover fan owner homeowner user member
    customer client follower supporter believer beginner learner speaker reader listener
    watcher foreigner stranger newcomer outsider introvert extrovert resident citizen
    immigrant expat native local patient survivor parent mother father twin sibling widow
    widower tenant participant applicant perfectionist optimist pessimist minimalist realist
    idealist feminist christian civilian libertarian humanitarian contrarian worrier
    overthinker procrastinator dreamer planner goer holder seeker vegetarian vegan
    pescatarian voter buyer shopper traveler traveller passenger visitor guest subscriber
    renter borrower donor dependent""".split()
)
_NOT_JOB_SUFFIX = ("lover", "owner", "goer", "holder", "seeker", "watcher", "eater", "drinker")
_NOT_CURRENT = frozenset("former ex ex- past recovering aspiring wannabe would-be future".split())
_NOT_JOBS_ZH = re.compile(r"会员|成员|党员|团员|粉丝|吃货")


def _is_occupation(value: str) -> bool:
    words = value.replace("ex-", "ex ").split()
    if not words or words[0].lower() in _NOT_CURRENT:
        return False
    head = words[-1]
    if head[:1].isupper() and head.isascii():  # "a Londoner", "a Catholic": who, not a job
        return False
    head = head.lower()
    if head in _NOT_JOBS or head.endswith(_NOT_JOB_SUFFIX) or _is_identity(head):
        return False
    return not _NOT_JOBS_ZH.search(value)


_JOB_WORD = (
    r"(?:\w*(?:nurse|chef|student|analyst|lawyer|clerk|pilot|medic|mechanic|surgeon|attorney|"
    r"barista|nanny|midwife|secretary)|cook|vet|intern|judge|\w+(?:er|or|ist|ian|ant|ent|eer|ect))"
)
# Words that say a statement is the current one, after a change: "I now work as", "I'm now a".
_NOW_EN = r"(?:now |currently |these days |just |recently )?"
_OCCUPATION = (
    re.compile(
        rf"\b(?:I {_NOW_EN}work as|my (?:new |current )?(?:job|occupation|profession) is) "
        r"(?:an? )?([\w -]{3,40}?)" + _END,
        _I,
    ),
    re.compile(
        rf"\b(?:I'm|I am|I['’]ve become|I have become|I became) {_NOW_EN}(?:an? )"
        rf"((?:\w+ )?{_JOB_WORD})\b",
        _I,
    ),
    re.compile(
        r"(?:我是|职业是|我当|^是|[，,]是|(?:现在|如今|目前)(?:是|当|做)|(?:改行|转行)(?:当|做|成)了?|"
        r"当上了|成为了?)(?:一名|一个|个)?([\u4e00-\u9fff]{0,6}?"
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
    re.compile(r"\bI (?:really |also )?(?:like|love|enjoy) (\w+ing(?: \w+)?)" + _END, _I),
    re.compile(r"(?:爱好是|喜欢|爱)(" + _ACTIVITIES_ZH + ")"),
)
_INTEREST = (
    re.compile(r"\b(?:I'm|I am) (?:really |very )?interested in ([\w ,'-]{3,60}?)" + _END, _I),
    re.compile(r"\bI'm (?:a big |a huge )?fan of ([\w ,'-]{3,60}?)" + _END, _I),
    # Never across a negation: "我对猫不感兴趣" is no interest in "猫不".
    re.compile(r"对((?:(?![不没])[\u4e00-\u9fff\w]){1,12}?)(?:很|非常|比较|特别)?感兴趣"),
    # Likes that are not activities (those are hobbies): "I love spicy food", "我喜欢猫".
    re.compile(
        # Not what points at something said or shown ("I love your turtles", "I love how you
        # did it", "I like the idea"): that is a reply, not a taste of the user's.
        r"\bI (?:really |also |just )?(?:like|love|prefer|adore) "
        r"(?!(?:to|it|that|this|these|those|them|your|you|how|when|what|where|the (?:idea|"
        r"thought|way|colou?rs?|pics?|pictures?|photos?|look|vibes?|feeling|sound))\b)"
        r"((?!\w+ing\b)[\w '-]{2,40}?)" + _END,
        _I,
    ),
    re.compile(
        r"(?:我|但是?|而且|还)?(?:很|非常|特别|也|最)?(?<![不讨])(?:喜欢|爱)(?![吃的])(?!"
        + _ACTIVITIES_ZH
        + r")([\u4e00-\u9fff\w]{1,10}?)"
        + _ZH_END
    ),
)
#: What follows "busy" when it limits the user at a time (`_CONSTRAINT`).
_BUSY_WHEN_EN = (
    r"(?:on|every|all|most|until|till|through|during|in the|this|next|tomorrow|today|tonight|"
    r"weekdays|weekends|mornings|afternoons|evenings|nights|"
    r"(?:mon|tues|wednes|thurs|fri|satur|sun)days?)"
)
#: A time before "忙" (within a few characters) that makes being busy a constraint: "我周三很忙",
#: not "最近很忙" or "忙着搬家".
_BUSY_WHEN_ZH = (
    r"周[一二三四五六日天末]|星期[一二三四五六日天]|礼拜[一二三四五六日天]|每天|每周|每晚|"
    r"早上|上午|中午|下午|晚上|明天|今天|今晚|后天|工作日|这周|下周|这个月|下个月"
)
#: What follows "can't" when it is a feeling, not something the user cannot do.
_NOT_A_LIMIT_EN = (
    r"wait|believe|thank|imagine|stop|help|express|describe|tell you|say enough|get enough|"
    r"resist|agree|be (?:happier|prouder|more)|even|complain|forget|get over|beat|let go"
)
_CONSTRAINT = re.compile(
    # Busy at a time is a constraint ("busy on Wednesdays", "busy every morning"); a busy week,
    # being busy with work or "can't wait" is news or a feeling, not a limit on the user.
    rf"\b(?:busy (?:{_BUSY_WHEN_EN})\b|not available|not free|unavailable|"
    rf"(?:can't|can['’]t|cannot|can not)(?! (?:{_NOT_A_LIMIT_EN})\b)|"
    r"allergic|allergy|allergies|"
    r"intolerant|only (?:on|after|before)|don't call|do not call|never on|budget|hated?|hates|"
    r"dislike[sd]?|"
    # A diet one keeps ("I'm a vegetarian", "Sam is vegan"), not a dish ("vegan ice cream").
    r"(?:am|['’]m|is|are|['’]re|was|were|been|be|became|become|went|gone|going|stay|stayed)"
    r" (?:an? |now |strictly |fully |mostly |still )?(?:vegan|vegetarian|pescatarian)|"
    # ... and one given up: "no longer vegan", "not a vegetarian anymore", "stopped being vegan"
    r"(?:no longer|not|never|(?:stopped|quit|gave up) being) (?:an? )?"
    r"(?:vegan|vegetarian|pescatarian)|"
    r"(?:don't|do not|didn't|did not|never|no longer) (?:really |much |particularly )?"
    r"(?:like[sd]?|love[sd]?|enjoy(?:s|ed)?|care for|eat|drink)|"
    r"(?:not|never been) (?:a (?:big |huge )?fan of|into|interested in)|avoid)\b|"
    rf"(?:{_BUSY_WHEN_ZH})[^，。,.!?！？]{{0,4}}忙|没空|不方便|过敏|不能|只能|预算|别打电话|讨厌|忌口|吃素|素食者|素食主义|不感兴趣|没兴趣|没有兴趣|"
    r"(?:不|没有?)(?:太|是很|是特别|怎么|那么|再|大|很|是那么)?(?:喜欢|爱)|不吃|不喝",
    _I,
)
# A diet given up: its own comma-separated part is the constraint, so that the profile merge
# takes it for a correction of the diet ("not a vegetarian anymore" replaces "a vegetarian";
# with ", I eat fish now" it would be another fact beside it).
_GIVEN_UP = re.compile(
    r"[^,，]*\b(?:no longer|not|never|(?:stopped|quit|gave up) being) (?:an? )?"
    r"(?:vegan|vegetarian|pescatarian)\b[^,，]*",
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
#: A "goal" that only points at the conversation ("I want to tell you", "I hope to help make
#: that happen", "I'd like to see it"): a reply, not a plan of the user's.
_REPLY_GOAL = re.compile(
    r"^(?:tell|ask|show|let|thank|say)\b"
    r"|^(?:see|hear) (?:it|that|this|them|you|your|more|what|how)\b"
    r"|^(?:\S+ ){0,3}(?:you|it|that|this|them|there|that happen|it happen)$"
    r"|^(?:告诉|跟你|和你|问你|给你|谢谢|让你)|(?:你|它|这个|那个|这样)$",
    _I,
)
_PET_EN = r"dog|cat|puppy|kitten|parrot|hamster|rabbit|bunny|turtle|goldfish|horse|pet"
_KIN_EN = (
    r"wife|husband|partner|fianc[ée]e?|son|daughter|kid|child|baby|mother|mom|mum|father|dad|"
    r"brother|sister|grandmother|grandma|grandfather|grandpa|aunt|uncle|cousin|niece|nephew|"
    r"boyfriend|girlfriend|friend|best friend|roommate|flatmate|neighbou?r|boss|manager|"
    r"colleague|coworker|teacher|doctor|therapist|coach|mentor"
)
_KIN_ZH = (
    r"狗|猫|兔子|鹦鹉|仓鼠|金鱼|乌龟|小狗|小猫|老婆|老公|妻子|丈夫|儿子|女儿|孩子|妈妈|母亲|爸爸|父亲|"
    r"哥哥|姐姐|弟弟|妹妹|爷爷|奶奶|外公|外婆|姥姥|姥爷|男朋友|女朋友|朋友|同事|老板|领导|室友|邻居|老师"
)
_NAMED = r"(?:'s name is| is called| is named| named| called|,)?"
_MONTHS = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_DATE = (
    rf"(?:{_MONTHS} \d{{1,2}}(?:st|nd|rd|th)?|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?{_MONTHS})"
    r"(?:,? \d{4})?|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?"
)
_SHIP_TO = (
    r"my address is|I (?:now |currently )?live at|ship (?:it )?to|deliver (?:it )?to|"
    r"send (?:it )?to"
)
# A move: the address moved to is the current one ("I moved from 12 Elm Street to 14 Elm
# Street", "We've just moved to 9 Mill Lane, Cork"); only a place (a number or a name).
_MOVED_TO = re.compile(
    r"\b(?:I|we)(?:['’]ve| have)? (?:just |recently |finally )?moved (?:house |home )?"
    r"(?:from .{2,60}? )?to ((?=[^,;.!?]*\d|(?-i:[A-Z])).{2,120}?)"
    r"(?=[;!?]|\.(?:\s|$)|\s(?:for|because|since|when|after|before|so|to be|with|in \d{4})\b|$)",
    _I,
)
# When a value was said, after it: "14 Elm Street last week", "Bristol, a month ago".
_TRAILING_TIME = re.compile(
    r"(?:,?\s+(?:last|this|next) \w+|,?\s+(?:yesterday|today|recently|lately|now|"
    r"from now on)|,?\s+(?:a|an|one|two|three|four|five|six|a few|few|several|\d+) "
    r"(?:days?|weeks?|months?|years?) ago|,?\s+in \d{4})\s*$",
    _I,
)
# What makes a key the current one of a field ("my new address is" states the address).
_KEY_CURRENT = re.compile(r"^(?:new|current|updated|latest|present) (?=\w)", _I)
_TIME_WORD = r"on|from|between|after|before|in|at|during|every"
_RELATION = (
    re.compile(rf"\b(?:[Mm]y|[Oo]ur) ({_PET_EN}|{_KIN_EN}){_NAMED} ([A-Z][a-z'-]+)\b"),
    re.compile(rf"\bI have an? ({_PET_EN}|{_KIN_EN}) (?:named|called) ([A-Z][a-z'-]+)\b", _I),
    re.compile(rf"\b(?P<who>[A-Z][a-z'-]+),? (?:the|our|my) (?P<kind>{_PET_EN})\b"),
    re.compile(rf"\b(?P<who>[A-Z][a-z'-]+) is (?:my|our) (?P<kind>{_PET_EN}|{_KIN_EN})\b"),
    re.compile(
        rf"(?:我家|我的|我)?(?:有一只|有只|养了一只|养了只|有一个|有个|的)?({_KIN_ZH})(?:的?名字)?(?:叫|是)"
        r"([\u4e00-\u9fff\w]{1,4}?)" + _ZH_END
    ),
    re.compile(rf"(?P<who>[\u4e00-\u9fff]{{2,3}})是我(?:的)?(?P<kind>{_KIN_ZH})" + _ZH_END),
)
_PETS = frozenset(_PET_EN.split("|")) | frozenset(
    "狗 猫 兔子 鹦鹉 仓鼠 金鱼 乌龟 小狗 小猫".split()
)
_PEOPLE = re.compile(rf"^(?:{_PET_EN}|{_KIN_EN})$", _I)

# "my X is Y" / "the X is Y" / "my X, which is on Y": X in the speaker's words (one to three
# lower-case words, a possessive allowed: "sister's wedding"), Y up to the end of the clause.
# A named person's ("Tom's birthday is May 5") is read too, and goes to relationships.
_STATED_EN = re.compile(
    r"\b(?:[Mm]y|[Oo]ur|[Tt]he|(?!(?:It|That|What|There|Here|Who|Where|How|Let|She|He)['’]s)"
    r"[A-Z][a-z]+['’]s) (?:own )?((?:[a-z][a-z'-]* ){0,2}[a-z][a-z'-]*)"
    r"(?:,? which)? (?:is|was|are|will be)(?: on| at| in)? (.{1,120}?)" + _LONG_VALUE_END
)
_FAVOURITE_EN = re.compile(
    r"\b(?:[Mm]y )?((?:least )?favou?rite (?:[a-z]+ ){0,1}[a-z]+) (?:is|are|was) (.{1,80}?)"
    + _VALUE_END
)
_ENDING_IN = re.compile(
    r"\b((?:\w+['’]s )?\w+(?: \w+)?) (?:ending|ends) (?:in|with) (\d{2,})\b|"
    r"\blast (?:four|4|three|3|two|2) digits of (?:my |the )?(\w+(?: \w+)?) (?:are|is) (\d{2,})\b",
    _I,
)
# A dated event of one's own: "my brother Tomasz is getting married on 12 September 2026".
_DATED_EN = re.compile(
    rf"\b(?:[Mm]y|[Oo]ur) ([^.;!?,]{{3,60}}?),? (?:on|is on|was on|is|was|will be on) ({_DATE})\b"
)
_BORN_EN = re.compile(rf"\bI was born (?:on |in )?({_DATE}|\d{{4}})", _I)
_USES_EN = re.compile(
    r"\b(?:I (?:use|own|have|drive|bought|got)|I'm using|using|on my|with my) (?:an? |my |the )?"
    r"((?=\S*[A-Z])[A-Za-z][\w+-]*(?: (?:[A-Z0-9][\w+-]*|mini|plus|pro|max|ultra)){1,3})"
)
# Chinese "X是Y" where Y holds a number or Latin letters (an id, a date, a model, an address).
_STATED_ZH = re.compile(
    r"([\u4e00-\u9fff]{1,8}?)(?:是|为|：|:)\s*"
    r"((?=[^，。！？；,;!?]*[0-9A-Za-z])[\u4e00-\u9fff0-9A-Za-z][\u4e00-\u9fff0-9A-Za-z \-#./]*?)"
    + r"(?=[，。！？；,;!?]|$)"
)
_TAIL_ZH = re.compile(r"([\u4e00-\u9fff]{0,6}尾号)(?:是|为)?\s*(\d{2,})")
_FAVOURITE_ZH = re.compile(
    r"(最喜欢的[\u4e00-\u9fff]{1,4}?|最喜欢吃的|最爱吃的)(?:是|就是)([\u4e00-\u9fff\w ]{1,16}?)"
    + _ZH_END
)
_LIKES_TO_EAT_ZH = re.compile(r"(?:最喜欢吃|最爱吃|爱吃)([\u4e00-\u9fff\w]{1,12}?)" + _ZH_END)
_BORN_ZH = re.compile(r"(?:出生于|出生在|生于)((?:\d{4}年)?(?:\d{1,2}月)?(?:\d{1,2}[日号])?)")
_ADDRESS = (
    re.compile(rf"\b(?:{_SHIP_TO}) (.{{6,120}}?)(?=[;!?]|\.(?:\s|$)|$)", _I),
    re.compile(
        r"(?:地址是|地址：|地址:|住在|住址是|搬到了?|搬去了?|搬进了?|搬家到)\s*(.{4,60}?)"
        + r"(?=[。！？；;!?]|$)"
    ),
)
_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])([A-Za-z0-9._%+-]+@[A-Za-z0-9-]+\.[A-Za-z0-9.-]*[A-Za-z0-9])"
)
_AVAILABLE = (
    re.compile(
        r"\b(?:I'm |I am )?(?:usually |only |mostly )?(?:free|available|reachable)\s+"
        rf"((?:{_TIME_WORD})\b.{{2,60}}?)" + _VALUE_END,
        _I,
    ),
    re.compile(r"([^，。！？\s]{2,20}?)(?:有空|比较闲|空闲)"),
)
# Keys that name no field of their own ("my point is 3", "the thing was 2 years ago").
_VAGUE_KEYS = frozenset(
    "it this that thing things point problem issue question answer reason idea way time day "
    "one ones rest other same first last next best worst only plan trip story weather".split()
)
_ZH_VAGUE_KEYS = frozenset(
    "这 那 这个 那个 就 也 都 还 只 不 没 就是 还是 可是 但是 于是 要是 总是".split()
)
# Said in fields of their own (name, occupation) or by a pattern of their own (favourites).
_OWN_FIELDS = frozenset("name job occupation profession favourite favorite".split())
# A value that is concrete: a digit, a capitalised word past the first, an address or email.
_CONCRETE = re.compile(r"\d|@|(?<=\s)[A-Z][a-z]|^[A-Z][\w'-]*\s+[A-Z]")
_LEADING_ZH = re.compile(r"^(?:我的|我家的|我们的|我们|我家|我|的|用的|在用的)+")


# Asking about oneself with the word order of a question, whatever the final mark:
# "Am I allergic to shellfish.", "Is my flight on May 3".
_ASKS_EN = re.compile(
    r"^(?:(?:hey|so|ok(?:ay)?|and|but|also|well|oh|um|hmm|wait)[\s,]+)*"
    r"(?:am|is|are|was|were|do|does|did|have|has|had|can|could|will|would|should|shall|may|"
    r"might|must)\s+(?:i|my|me|we|our)\b",
    _I,
)
# A Chinese clause that asks: an A-not-A form (是不是, 能不能, 有没有, 喜不喜欢) or 是否/能否.
_ASKS_ZH = re.compile(r"([\u4e00-\u9fff])[不没]\1|是否|能否|可否")
# Where doubting or asking starts inside a sentence: what follows is not stated.
_HEDGE = re.compile(
    r"\b(?:I(?:['’]m| am) )?(?:not (?:sure|certain)|unsure|uncertain)\b|"
    r"\b(?:I )?(?:wonder(?:ing|ed)?|doubt)\b|"
    r"\b(?:I )?(?:don['’]t|do not|didn['’]t|did not|can['’]t|cannot) (?:know|remember|recall|"
    r"tell)\b|\bno idea\b|"
    r"\b(?:can|could|would|will) you(?: please)? (?:check|see|confirm|verify|find out|look up|"
    r"look into|figure out|tell me|let me know)\b|"
    r"\b(?:check|confirm|verify|see|ask(?:ing|ed)?|find out|figure out|(?<!let me )know|"
    r"remember|curious)(?: \w+){0,2}? (?:if|whether)\b|\bwhether\b|"
    r"不确定|不清楚|不知道|不记得|记不清|记不得|想知道|想问|帮我(?:查|看|确认|问)|查一下|查查|"
    r"确认一下",
    _I,
)
_TRAILING_LINK = re.compile(r"[\s,，:：]*(?:\b(?:and|but|so|or|though|yet)\b)?[\s,，:：]*$", _I)
_SENTENCE_DONE = tuple("。！？；.!?;")


# Where a doubt with its own object ends ("I'll see if I can find it, my order is 7781").
_HEDGE_SCOPE_END = re.compile(r"[,;，；]\s*|\s+(?=but\b)", _I)
# A clause offering the other half of a question ("我是不是对花生过敏，还是对芒果").
_ALTERNATIVE = re.compile(r"^(?:还是|或者|或是|抑或|or\b)", _I)


def _stated_parts(sentence: str) -> tuple[list[str], str]:
    """The parts of a sentence that state something, and what the clauses after it in the
    same sentence go with: "question" (an alternative: "还是..."), "doubt" (a doubt whose
    object is still to come: "I'm not sure, ...", "我不确定，") or "" (nothing)."""
    if is_question(sentence) or _ASKS_EN.match(sentence) or _ASKS_ZH.search(sentence):
        return [], "question"
    hedge = _HEDGE.search(sentence)
    if hedge is None:
        return [sentence], ""
    before = _TRAILING_LINK.sub("", sentence[: hedge.start()]).strip()
    parts = [before] if before else []
    scope_end = _HEDGE_SCOPE_END.search(sentence, hedge.end())
    doubted = sentence[hedge.end() : scope_end.start() if scope_end else len(sentence)]
    if not re.search(r"\w", doubted):
        return parts, "doubt"
    if scope_end is None:
        return parts, ""
    more, after = _stated_parts(sentence[scope_end.end() :])
    return parts + more, after


# What negates a like, a free time or a favourite when it comes before it in its clause.
_NEG_EN = re.compile(r"\b(?:not|never|no longer|hardly|barely|neither|nor)\b|n['’]t\b", _I)
_NEG_ZH = re.compile(r"[不没别未甭]|并非|从未")
_NOT_NEG_ZH = re.compile(
    r"不但|不仅|不只|不光|不错|不管|不论|不久|不少|不同|不断|差不多|忍不住|不用说|没想到|没事|"
    r"特别|分别|区别|别人|告别|级别|类别|未来"
)
_CLAUSE_BREAK = re.compile(
    r"[,;:，。；：、]|\b(?:but|and|so|though|although|yet|while|whereas|because)\b|"
    r"但|可是|不过|而且|然后|因为|所以",
    _I,
)


def _clause_head(text: str, pos: int) -> str:
    """What comes before `pos` in its own clause."""
    head = text[:pos]
    breaks = list(_CLAUSE_BREAK.finditer(head))
    return head[breaks[-1].end() :] if breaks else head


def _negated(text: str, pos: int) -> bool:
    """A negation before `pos` in the same clause: "It's not that I love", "我不太喜欢"."""
    head = _NOT_NEG_ZH.sub("", _clause_head(text, pos))
    return bool(_NEG_EN.search(head) or _NEG_ZH.search(head))


_CONTRACTIONS = frozenset(
    "it that what there here who where how let she he one everyone everybody nobody "
    "somebody someone today tomorrow tonight yesterday".split()
)
_OWNER_EN = re.compile(r"\b(?:(my|our|your|his|her|their)|([A-Za-z][\w-]*)['’]s)\b", _I)
_OWNER_ZH = re.compile(rf"(?P<kin>{_KIN_ZH}|他们|她们|他|她)|我")


def _owner(text: str, pos: int) -> str | None:
    """Whose the detail named before `pos` is: None for the speaker's own ("my email",
    "我的邮箱"); else the other person, in the speaker's words ("sister", "Anna", "儿子"), or
    "" for someone not named ("her email", "your order")."""
    head = _clause_head(text, pos)
    owner: str | None = None
    for m in _OWNER_EN.finditer(head):
        determiner, word = m.group(1), m.group(2)
        if determiner:
            owner = None if determiner.lower() in ("my", "our") else ""
        elif word and word.lower() not in _CONTRACTIONS:
            if _PEOPLE.match(word):  # "my sister's email"
                owner = word.lower()
            elif word[0].isupper():  # "Anna's email"
                owner = word
            # else "my email's x@y.com" (is), "my company's number": the speaker's still
    for m in _OWNER_ZH.finditer(head):
        owner = m.group("kin")
    return owner


_SUBJECT_OTHER_EN = re.compile(
    rf"^\W*(?:(?:and|but|also|so|oh|well|plus|then)\b\W*)*"
    rf"(?:(?:my|our) (?:{_PET_EN}|{_KIN_EN})s?\b(?!['’]s)|(?:he|she|they)\b)",
    _I,
)
_SUBJECT_OTHER_ZH = re.compile(
    rf"^(?:但是?|而且|还有|另外|其实|不过)?(?:我的|我家的?|我们家的?|我们的|我)?"
    rf"(?:{_KIN_ZH}|他们|她们|他|她)"
)
_SUBJECT_ME_EN = re.compile(r"\b(?:I|I['’]m|I['’]ve|I['’]d|me|we|we['’]re|us)\b")


def _said_of_other(head: str) -> bool:
    """The words before a constraint make someone else its subject: "my daughter is",
    "she's", "我妈妈对", "他"; not when the speaker is in them too ("my son and I")."""
    if _SUBJECT_ME_EN.search(head):
        return False
    if _SUBJECT_OTHER_EN.search(head):
        return True
    return bool(_SUBJECT_OTHER_ZH.search(head)) and "和" not in head


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
            if not human:
                continue
            # Questions ("What am I allergic to?") ask about facts, they never state one; nor
            # does what a doubt covers ("not sure whether ..."), nor the clauses that complete
            # a question or a doubt in the same sentence ("我不确定，...", "是不是...，还是...").
            pending = ""
            for sentence in split_sentences(line.strip()):
                parts: list[str]
                if pending == "doubt" or (pending == "question" and _ALTERNATIVE.match(sentence)):
                    parts, state = [], pending
                else:
                    parts, state = _stated_parts(sentence)
                sentences.extend(parts)
                pending = "" if sentence.endswith(_SENTENCE_DONE) else state
    return sentences


# A match that names its subject as the speaker ("I love jazz", "我喜欢猫").
_FIRST_PERSON = re.compile(r"\bI\b|^我")


def _first(patterns: Iterable[re.Pattern[str]], text: str, *, affirmed: bool = False) -> str | None:
    """The first value the patterns find; with `affirmed`, none that a negation precedes in
    its clause ("It's not that I love Paris", "我不太喜欢猫") and none said of someone else
    ("他们都喜欢爬山")."""
    for pattern in patterns:
        for match in pattern.finditer(text):
            value = next((g for g in match.groups() if g), "").strip()
            if affirmed and (
                _negated(text, match.start())
                or (
                    not _FIRST_PERSON.search(match.group(0))
                    and _said_of_other(_clause_head(text, match.start()))
                )
            ):
                continue
            if value and value not in _NOT_NAMES:
                return value
    return None


def _add(items: list[str], value: str | None) -> None:
    if value and value not in items:
        items.append(value)


def _clean(value: str) -> str:
    return _LEAD.sub("", value.strip().rstrip(".,;!。，；！")).strip()


def _stated_fields(sentence: str) -> tuple[dict[str, str], list[str]]:
    """Fields the sentence states, named in the speaker's words (later patterns never
    overwrite earlier ones within a sentence), and the details it states about someone else
    ("my wife's favourite band is Coldplay" -> "wife's favourite band: Coldplay")."""
    found: dict[str, str] = {}
    others: list[str] = []
    m: re.Match[str] | None

    def put(key: str, value: str, at: int) -> None:
        """`at`: where the value starts, so whose it is can be read from the words before."""
        key, value = _KEY_CURRENT.sub("", " ".join(key.split())), _clean(value)
        if key == "address":
            value = _TRAILING_TIME.sub("", value).rstrip(" ,")
        if not key or not value:
            return
        owner = _owner(sentence, at)
        if owner is None:
            if key not in found:
                found[key] = value
        elif owner:  # someone named: a fact about them, not the speaker's
            zh = bool(re.search(r"[\u4e00-\u9fff]", owner))
            if key.lower().startswith(owner.lower()):
                label = key
            else:
                label = f"{owner}的{key}" if zh else f"{owner}'s {key}"
            _add(others, f"{label}: {value}")
        # else "her email", "your order": whose is not said, so nothing is kept

    def put_if_affirmed(key: str, value: str, at: int, verb_at: int) -> None:
        if not _negated(sentence, verb_at):
            put(key, value, at)

    for m in _ENDING_IN.finditer(sentence):
        digits_at = m.start(2) if m.group(1) else m.start(4)
        noun, digits = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        noun = re.sub(r"^(?:my|the|a|an|our|your) ", "", noun.lower())
        put(f"{noun} ending in", digits, digits_at)
    for m in _FAVOURITE_EN.finditer(sentence):
        key = m.group(1).lower().replace("favorite", "favourite")
        put_if_affirmed(key, m.group(2), m.start(1), m.start(1))
    for m in _DATED_EN.finditer(sentence):
        put(m.group(1).lower(), m.group(2), m.start(2))
    for m in _STATED_EN.finditer(sentence):
        key, value = m.group(1), m.group(2)
        words = key.split()
        if words[-1] in _VAGUE_KEYS or _PEOPLE.match(key) or words[0] in _OWN_FIELDS:
            continue
        if _CONCRETE.search(value) and len(value.split()) <= 12:
            put(key, value, m.start(2))
    m = _BORN_EN.search(sentence)
    if m:
        put("born", m.group(1), m.start())
    m = _USES_EN.search(sentence)
    if m and re.search(r"\d|\s", m.group(1)):
        put("uses", m.group(1), m.start())
    for pattern in (_MOVED_TO, *_ADDRESS):
        m = pattern.search(sentence)
        if m:
            put("address", m.group(1), m.start(1))
            break
    m = _EMAIL.search(sentence)
    if m:
        put("email", m.group(1), m.start(1))
    for pattern in _AVAILABLE:
        m = pattern.search(sentence)
        if m:
            # "I'm not free on Monday", "我明天没有空": not a free time (a constraint, if any).
            put_if_affirmed("availability", m.group(1), m.start(1), m.end(1))
            break
    for m in _TAIL_ZH.finditer(sentence):
        put(_LEADING_ZH.sub("", m.group(1)) or "尾号", m.group(2), m.start(2))
    for m in _FAVOURITE_ZH.finditer(sentence):
        put_if_affirmed(m.group(1), m.group(2), m.start(2), m.start(1))
    m = _LIKES_TO_EAT_ZH.search(sentence)
    if m:
        put_if_affirmed("最喜欢吃的", m.group(1), m.start(1), m.start())
    m = _BORN_ZH.search(sentence)
    if m and m.group(1):
        put("出生", m.group(1), m.start())
    for m in _STATED_ZH.finditer(sentence):
        key = _LEADING_ZH.sub("", m.group(1).split("的")[-1] if "的" in m.group(1) else m.group(1))
        if key and key not in _ZH_VAGUE_KEYS and not re.fullmatch(_KIN_ZH, key):
            if not key.endswith("尾号") and "地址" not in key:
                put(key, m.group(2), m.start(2))
    return found, others


def extract_profile(contents: Iterable[str]) -> UserProfile:
    """A profile update holding only what the human lines state outright."""
    update = UserProfile()
    for sentence in _human_sentences(contents):
        name = _first(_NAME, sentence)
        if name and not _is_identity(name):  # "I'm Italian" says what, not who
            update.name = update.name or name
        occupation = _first(_OCCUPATION, sentence)
        if occupation and _is_occupation(occupation):
            # The latest statement is the user's latest word ("I'm a paramedic now").
            update.occupation = occupation
        # A negated like ("我不太喜欢猫") is no hobby or interest; a dislike is a constraint.
        hobby = _first(_HOBBY, sentence, affirmed=True)
        _add(update.hobbies, hobby)
        interest = _first(_INTEREST, sentence, affirmed=True)
        if interest != hobby:
            _add(update.interests, interest)
        goal = _first(_GOAL, sentence)
        _add(update.goals, None if goal is None or _REPLY_GOAL.search(goal) else goal)
        for clause in _CLAUSE.split(sentence):
            constraint = _CONSTRAINT.search(clause)
            if constraint:
                # The clause as the human said it: paraphrasing is where details get lost.
                # Someone else's ("my partner Sam is vegetarian", "我妈妈对花生过敏") is about them.
                about_other = _said_of_other(clause[: constraint.start()])
                field = update.relationships if about_other else update.constraints
                given_up = _GIVEN_UP.search(clause)
                _add(field, _clean(given_up.group() if given_up else clause) or None)
        for pattern in _RELATION:
            for match in pattern.finditer(sentence):
                named = match.groupdict()
                kind, who = (named["kind"], named["who"]) if named else match.groups()
                label = f"pet {kind}" if kind.lower() in _PETS else kind
                if who not in _NOT_NAMES:
                    _add(update.relationships, f"{label}: {who}")
        # A later statement corrects an earlier one ("sorry, the order is 4471").
        fields, others = _stated_fields(sentence)
        update.business_fields.update(fields)
        for other in others:
            _add(update.relationships, other)
    return update
