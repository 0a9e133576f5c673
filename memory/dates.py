"""Relative dates resolved against when they were said: "yesterday", "last Saturday", "two
weeks ago", 昨天, 上周六, 下个月 ... become absolute dates (docs/ARCHITECTURE.md, "Dated lines").

Pure and deterministic; no I/O, no model. A turn's time is unix seconds and is read in UTC (the
time zone of the speaker is not known; the stored line's own date is read the same way, so the
two agree). What is resolved, and how:

- days: yesterday, today, tonight, tomorrow, the day before yesterday / after tomorrow, last
  night; 大前天, 前天, 昨天, 今天, 明天, 后天, 大后天 (and 昨日, 昨晚 ...);
- weekdays: "last Friday" is the latest Friday before the day it was said (on a Friday, the one
  a week before), "next Friday" and "this coming Friday" the first one after it, "this Friday"
  the one in the same Monday-to-Sunday week. Chinese counts calendar weeks: 上周六 is the
  Saturday of the week before, 下周六 of the week after, 这周六 / 本周六 of the same week;
- weeks, weekends, months, years: last / this / next week (labelled by its Monday), weekend
  (by its Saturday), month, year; 上周, 这周, 下周, 上周末, 这个周末, 上个月, 下个月, 去年,
  前年, 明年 ...;
- counted: "two weeks ago", "3 days ago", "a month ago", "in two weeks", "5 days from now";
  两周前, 三天前, 十二个月前, 2年后 (Arabic digits and Chinese numerals).

Vague amounts ("a few days ago", 几天前) are left alone: no single date is meant.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from dataclasses import dataclass

__all__ = [
    "Resolved",
    "chinese_number",
    "day_label",
    "month_label",
    "resolve_dates",
    "said_on",
]

_MONTHS = (
    "January February March April May June July August September October November December"
).split()
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()


@dataclass(frozen=True)
class Resolved:
    """One relative expression of a text and the date it names."""

    start: int
    end: int
    said: str  # the expression as it stands in the text
    label: str  # the absolute date: "7 May 2023", "May 2023", "2022", "week of 1 May 2023"


def said_on(at: float) -> dt.date:
    """The (UTC) day of a unix time."""
    return dt.datetime.fromtimestamp(at, tz=dt.UTC).date()


def day_label(day: dt.date) -> str:
    """`7 May 2023`: the form the prompt's dates take (`memory.prompt.date_label`)."""
    return f"{day.day} {_MONTHS[day.month - 1]} {day.year}"


def month_label(year: int, month: int) -> str:
    """`May 2023`."""
    return f"{_MONTHS[month - 1]} {year}"


def _add_months(year: int, month: int, n: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + n
    return index // 12, index % 12 + 1


def _add_months_day(day: dt.date, n: int) -> dt.date:
    """The same day of the month `n` months later, clamped to the month's end (31 March + 1
    month is 30 April; 29 February + 12 months is 28 February)."""
    year, month = _add_months(day.year, day.month, n)
    return dt.date(year, month, min(day.day, calendar.monthrange(year, month)[1]))


def _monday(day: dt.date) -> dt.date:
    return day - dt.timedelta(days=day.weekday())


def _week(day: dt.date) -> str:
    return f"week of {day_label(_monday(day))}"


def _weekend(day: dt.date) -> str:
    """The weekend of the Monday-to-Sunday week holding `day`, by its Saturday."""
    return f"weekend of {day_label(_monday(day) + dt.timedelta(days=5))}"


_EN_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "a couple of": 2,
    "couple of": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
}
_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "兩": 2, "三": 3, "四": 4, "五": 5}
_CN_DIGITS.update({"六": 6, "七": 7, "八": 8, "九": 9})
_CN_UNITS = {"十": 10, "百": 100, "千": 1000}


def chinese_number(text: str) -> int | None:
    """An integer written in Arabic digits (also full-width) or Chinese numerals: 三 3, 十 10,
    十二 12, 二十 20, 二十三 23, 两 2, 一百零五 105; None when it is not one."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)  # int() reads full-width digits too
    total = 0
    current = 0
    for ch in text:
        if ch in _CN_DIGITS:
            current = _CN_DIGITS[ch]
        elif ch in _CN_UNITS:
            total += (current or 1) * _CN_UNITS[ch]
            current = 0
        else:
            return None
    return total + current


def _counted(day: dt.date, n: int, unit: str, sign: int) -> str:
    """The date `n` units before (sign -1) or after (+1) `day`: a day for days and weeks, a
    month for months, a year for years."""
    if unit == "day":
        return day_label(day + dt.timedelta(days=sign * n))
    if unit == "week":
        return day_label(day + dt.timedelta(days=sign * 7 * n))
    if unit == "month":
        y, m = _add_months(day.year, day.month, sign * n)
        return month_label(y, m)
    return str(day.year + sign * n)


def _relative_unit(day: dt.date, unit: str, shift: int) -> str:
    """last (-1) / this (0) / next (+1) week, weekend, month or year."""
    if unit == "week":
        return _week(day + dt.timedelta(days=7 * shift))
    if unit == "weekend":
        return _weekend(day + dt.timedelta(days=7 * shift))
    if unit == "month":
        return month_label(*_add_months(day.year, day.month, shift))
    return str(day.year + shift)


def _weekday_en(day: dt.date, which: str, weekday: int) -> dt.date:
    """`which` Monday..Sunday: last (latest before the day), next / coming (first after it),
    this (in the same Monday-to-Sunday week)."""
    if which == "last":
        return day - dt.timedelta(days=(day.weekday() - weekday) % 7 or 7)
    if which == "this":
        return _monday(day) + dt.timedelta(days=weekday)
    return day + dt.timedelta(days=(weekday - day.weekday()) % 7 or 7)


_EN_DAYS = {
    "the day before yesterday": -2,
    "the day after tomorrow": 2,
    "day before yesterday": -2,
    "day after tomorrow": 2,
    "yesterday": -1,
    "last night": -1,
    "today": 0,
    "tonight": 0,
    "this morning": 0,
    "this afternoon": 0,
    "this evening": 0,
    "tomorrow": 1,
}
_EN_COUNT = "|".join(sorted((re.escape(k) for k in _EN_NUMBERS), key=len, reverse=True))
_EN_PATTERN = re.compile(
    r"\b(?:"
    rf"(?P<day>{'|'.join(sorted(_EN_DAYS, key=len, reverse=True))})"
    r"|(?P<wwhich>last|this coming|this|next|coming)\s+(?P<wday>" + "|".join(_WEEKDAYS) + r")"
    r"|(?P<uwhich>last|this past|past|this|next|coming)\s+(?P<unit>weekend|week|month|year)"
    rf"|(?P<agon>\d{{1,3}}|{_EN_COUNT})\s+(?P<agou>day|week|month|year)s?\s+ago"
    rf"|in\s+(?P<inn>\d{{1,3}}|{_EN_COUNT})\s+(?P<inu>day|week|month|year)s?\b(?!\s+ago)"
    rf"|(?P<fromn>\d{{1,3}}|{_EN_COUNT})\s+(?P<fromu>day|week|month|year)s?\s+from\s+now"
    r")\b",
    re.IGNORECASE,
)

_CN_WEEK = "(?:周|星期|礼拜|禮拜)"
_CN_NUM = "[0-9０-９零〇一二两兩三四五六七八九十百]+"
_CN_DAYS = {
    "大前天": -3,
    "前天": -2,
    "前日": -2,
    "昨天": -1,
    "昨日": -1,
    "昨晚": -1,
    "今天": 0,
    "今日": 0,
    "今晚": 0,
    "明天": 1,
    "明日": 1,
    "明晚": 1,
    "大后天": 3,
    "大後天": 3,
    "后天": 2,
    "後天": 2,
}
_CN_SHIFT = {"上上": -2, "上": -1, "这": 0, "這": 0, "本": 0, "下下": 2, "下": 1}
_CN_YEARS = {"前年": -2, "去年": -1, "今年": 0, "明年": 1, "后年": 2, "後年": 2}
_CN_WEEKDAYS = {"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6}
_CN_PATTERN = re.compile(
    rf"(?P<cshift>上上|上|这|這|本|下下|下)个?{_CN_WEEK}(?P<cwd>[一二三四五六日天末])?"
    rf"|(?P<cmonth>上上|上|这|這|本|下下|下)个?月(?![0-9０-９一二三四五六七八九十]+[日号號])"
    rf"|(?P<cyear>{'|'.join(_CN_YEARS)})"
    rf"|(?P<cday>{'|'.join(sorted(_CN_DAYS, key=len, reverse=True))})"
    rf"|(?P<cn>{_CN_NUM})(?:个|個)?(?P<cu>天|日|{_CN_WEEK}|月|年)(?P<cdir>以前|之前|前|以后|以後|之后|之後|后|後)"
    rf"|(?P<cweekend>周末|週末)"
)
_CN_UNIT = {"天": "day", "日": "day", "月": "month", "年": "year"}


def _english(text: str, day: dt.date) -> list[Resolved]:
    out = []
    for m in _EN_PATTERN.finditer(text):
        g = {k: (v.lower() if v else v) for k, v in m.groupdict().items()}
        label: str | None = None
        if g["day"]:
            label = day_label(day + dt.timedelta(days=_EN_DAYS[" ".join(g["day"].split())]))
        elif g["wday"]:
            which = " ".join(g["wwhich"].split())
            which = {"this coming": "next", "coming": "next"}.get(which, which)
            label = day_label(_weekday_en(day, which, _WEEKDAYS.index(g["wday"])))
        elif g["unit"]:
            which = " ".join(g["uwhich"].split())
            shift = {"last": -1, "past": -1, "this past": -1, "this": 0}.get(which, 1)
            label = _relative_unit(day, g["unit"], shift)
        else:
            for number, unit, sign in (
                ("agon", "agou", -1),
                ("inn", "inu", 1),
                ("fromn", "fromu", 1),
            ):
                if g[number]:
                    key = " ".join(g[number].split())
                    n = int(key) if key.isdigit() else _EN_NUMBERS[key]
                    label = _counted(day, n, g[unit], sign)
        if label:
            out.append(Resolved(m.start(), m.end(), m.group(0), label))
    return out


def _chinese(text: str, day: dt.date) -> list[Resolved]:
    out = []
    for m in _CN_PATTERN.finditer(text):
        g = m.groupdict()
        label: str | None = None
        if g["cshift"]:
            shift = _CN_SHIFT[g["cshift"]]
            wd = g["cwd"]
            target = day + dt.timedelta(days=7 * shift)
            if wd == "末":
                label = _weekend(target)
            elif wd:
                label = day_label(_monday(target) + dt.timedelta(days=_CN_WEEKDAYS[wd]))
            else:
                label = _week(target)
        elif g["cmonth"]:
            label = month_label(*_add_months(day.year, day.month, _CN_SHIFT[g["cmonth"]]))
        elif g["cyear"]:
            label = str(day.year + _CN_YEARS[g["cyear"]])
        elif g["cday"]:
            label = day_label(day + dt.timedelta(days=_CN_DAYS[g["cday"]]))
        elif g["cn"]:
            n = chinese_number(g["cn"])
            unit = _CN_UNIT.get(g["cu"], "week")
            if n is not None and 0 < n <= 1000:
                sign = -1 if g["cdir"] in ("以前", "之前", "前") else 1
                label = _counted(day, n, unit, sign)
        elif g["cweekend"]:
            # a weekend named alone: the coming one, or the one under way (said on Sat/Sun)
            label = _weekend(day)
        if label:
            out.append(Resolved(m.start(), m.end(), m.group(0), label))
    return out


def resolve_dates(text: str, at: float) -> list[Resolved]:
    """The relative date expressions of `text` said at unix time `at`, in text order, each with
    the absolute date it names. Expressions that overlap keep the first and longest."""
    if at <= 0 or not text:
        return []
    day = said_on(at)
    found = sorted(_english(text, day) + _chinese(text, day), key=lambda r: (r.start, -r.end))
    out: list[Resolved] = []
    for r in found:
        if out and r.start < out[-1].end:
            continue
        out.append(r)
    return out
