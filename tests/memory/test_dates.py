"""Relative dates resolved against when they were said (memory/dates.py): English and Chinese,
month ends, leap years, weekdays across a year end, "last Friday" said on a Friday."""

from __future__ import annotations

import calendar

import pytest

from mnemoflow.memory.dates import chinese_number, resolve_dates


def at(year: int, month: int, day: int, hour: int = 13) -> float:
    return float(calendar.timegm((year, month, day, hour, 56, 0, 0, 0, 0)))


def labels(text: str, when: float) -> list[tuple[str, str]]:
    return [(r.said, r.label) for r in resolve_dates(text, when)]


MON_8_MAY_2023 = at(2023, 5, 8)  # a Monday (LoCoMo's first session date)


@pytest.mark.parametrize(
    ("text", "when", "expected"),
    [
        ("I went there yesterday.", MON_8_MAY_2023, [("yesterday", "7 May 2023")]),
        ("Today was long", MON_8_MAY_2023, [("Today", "8 May 2023")]),
        ("see you tomorrow", at(2023, 12, 31), [("tomorrow", "1 January 2024")]),
        ("the day before yesterday", MON_8_MAY_2023, [("the day before yesterday", "6 May 2023")]),
        ("last night was fun", at(2023, 1, 1), [("last night", "31 December 2022")]),
        # leap years and month ends
        ("yesterday", at(2024, 3, 1), [("yesterday", "29 February 2024")]),
        ("yesterday", at(2023, 3, 1), [("yesterday", "28 February 2023")]),
        ("tomorrow", at(2023, 1, 31), [("tomorrow", "1 February 2023")]),
        ("next month", at(2023, 1, 31), [("next month", "February 2023")]),
        ("a month ago", at(2024, 3, 31), [("a month ago", "February 2024")]),
        ("last month", at(2024, 1, 15), [("last month", "December 2023")]),
        ("next year", at(2023, 12, 31), [("next year", "2024")]),
        # weekdays: "last X" is the latest X before the day it was said
        ("last Friday", at(2023, 5, 12), [("last Friday", "5 May 2023")]),  # said on a Friday
        ("last Saturday", MON_8_MAY_2023, [("last Saturday", "6 May 2023")]),
        ("last Saturday", at(2023, 5, 14), [("last Saturday", "13 May 2023")]),  # a Sunday
        ("last Saturday", at(2024, 1, 2), [("last Saturday", "30 December 2023")]),  # year end
        ("next Monday", MON_8_MAY_2023, [("next Monday", "15 May 2023")]),
        ("this coming Tuesday", at(2023, 12, 29), [("this coming Tuesday", "2 January 2024")]),
        ("this Friday", MON_8_MAY_2023, [("this Friday", "12 May 2023")]),
        # weeks and weekends (a week by its Monday, a weekend by its Saturday)
        ("last week", at(2024, 1, 2), [("last week", "week of 25 December 2023")]),
        ("this weekend", at(2023, 5, 10), [("this weekend", "weekend of 13 May 2023")]),
        ("last weekend", at(2023, 5, 10), [("last weekend", "weekend of 6 May 2023")]),
        ("this past weekend", at(2023, 5, 8), [("this past weekend", "weekend of 6 May 2023")]),
        # counted
        ("two weeks ago", MON_8_MAY_2023, [("two weeks ago", "24 April 2023")]),
        ("3 days ago", at(2023, 3, 2), [("3 days ago", "27 February 2023")]),
        ("a couple of weeks ago", MON_8_MAY_2023, [("a couple of weeks ago", "24 April 2023")]),
        ("five years ago", MON_8_MAY_2023, [("five years ago", "2018")]),
        ("in two weeks", at(2023, 12, 25), [("in two weeks", "8 January 2024")]),
        ("10 days from now", at(2023, 12, 25), [("10 days from now", "4 January 2024")]),
    ],
)
def test_english(text: str, when: float, expected: list[tuple[str, str]]) -> None:
    assert labels(text, when) == expected


@pytest.mark.parametrize(
    ("text", "when", "expected"),
    [
        ("我昨天去了公园", MON_8_MAY_2023, [("昨天", "7 May 2023")]),
        ("前天下雨", at(2024, 3, 1), [("前天", "28 February 2024")]),
        ("大前天", at(2024, 3, 1), [("大前天", "27 February 2024")]),
        ("明天见", at(2023, 12, 31), [("明天", "1 January 2024")]),
        ("后天", at(2024, 2, 28), [("后天", "1 March 2024")]),
        # calendar weeks: 上周六 is the Saturday of the week before
        ("上周六我们爬山", at(2023, 5, 14), [("上周六", "6 May 2023")]),  # said on a Sunday
        ("上周六", at(2024, 1, 2), [("上周六", "30 December 2023")]),  # across the year end
        ("上星期天", at(2024, 1, 3), [("上星期天", "31 December 2023")]),
        ("下周一", at(2023, 12, 28), [("下周一", "1 January 2024")]),
        ("这周五", MON_8_MAY_2023, [("这周五", "12 May 2023")]),
        ("下个礼拜三", MON_8_MAY_2023, [("下个礼拜三", "17 May 2023")]),
        ("上周", at(2024, 1, 2), [("上周", "week of 25 December 2023")]),
        ("这个周末", at(2023, 5, 10), [("这个周末", "weekend of 13 May 2023")]),
        ("上周末", at(2023, 5, 10), [("上周末", "weekend of 6 May 2023")]),
        # months and years
        ("下个月", at(2023, 1, 31), [("下个月", "February 2023")]),
        ("上个月", at(2024, 1, 15), [("上个月", "December 2023")]),
        ("上上个月", at(2024, 1, 15), [("上上个月", "November 2023")]),
        ("去年", at(2024, 1, 1), [("去年", "2023")]),
        ("前年", at(2024, 1, 1), [("前年", "2022")]),
        # counted, Chinese numerals and digits
        ("两周前", MON_8_MAY_2023, [("两周前", "24 April 2023")]),
        ("十二天前", MON_8_MAY_2023, [("十二天前", "26 April 2023")]),
        ("二十天后", MON_8_MAY_2023, [("二十天后", "28 May 2023")]),
        ("三个月前", MON_8_MAY_2023, [("三个月前", "February 2023")]),
        ("3年前", MON_8_MAY_2023, [("3年前", "2020")]),
        ("两个星期以后", at(2023, 12, 25), [("两个星期以后", "8 January 2024")]),
    ],
)
def test_chinese(text: str, when: float, expected: list[tuple[str, str]]) -> None:
    assert labels(text, when) == expected


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("三", 3),
        ("十", 10),
        ("十二", 12),
        ("二十", 20),
        ("二十三", 23),
        ("两", 2),
        ("一百零五", 105),
    ],
)
def test_chinese_numbers(text: str, value: int) -> None:
    assert chinese_number(text) == value


def test_not_a_number() -> None:
    assert chinese_number("几") is None
    assert chinese_number("") is None


@pytest.mark.parametrize(
    "text",
    [
        "a few days ago",  # vague: no single date is meant
        "几天前",
        "I may go on Mondays",
        "the weekly meeting",
        "yesterdays are gone",
    ],
)
def test_nothing_to_resolve(text: str) -> None:
    assert resolve_dates(text, MON_8_MAY_2023) == []


def test_several_in_text_order_with_spans() -> None:
    text = "Yesterday I booked it for next Friday, 下个月 we go."
    found = resolve_dates(text, MON_8_MAY_2023)
    assert [(r.said, r.label) for r in found] == [
        ("Yesterday", "7 May 2023"),
        ("next Friday", "12 May 2023"),
        ("下个月", "June 2023"),
    ]
    assert all(text[r.start : r.end] == r.said for r in found)


def test_unknown_time_resolves_nothing() -> None:
    assert resolve_dates("yesterday", 0.0) == []
