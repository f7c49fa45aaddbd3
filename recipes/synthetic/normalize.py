"""Text normalisation for labels and synthesis: numbers, symbols and abbreviations spelled out.

The result is lowercase a-z, apostrophes inside words and single spaces: what the model emits.
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from functools import partial

from num2words import num2words

ABBREVIATIONS = {
    "mr": "mister", "mrs": "missus", "ms": "miz", "dr": "doctor", "jr": "junior", "sr": "senior",
    "st": "saint", "mt": "mount", "vs": "versus", "etc": "et cetera", "approx": "approximately",
    "e.g": "for example", "i.e": "that is",
}
# Short words written in capitals for emphasis, not acronyms.
CAPS_WORDS = frozenset("""
AM AN AS AT BE BY DO GO HE HI IF IN IS IT ME MY NO OF OH OK ON OR SO TO UP WE ALL AND ANY ARE BAD BIG
BUT CAN DID FOR GET GOT HAD HAS HER HIM HIS HOW ITS LET MAN MAY NEW NOT NOW OFF OLD ONE OUR OUT OWN SAY
SEE SHE THE TOO TRY TWO USE WAS WAY WHO WHY YES YET YOU""".split())
SYMBOLS = {"&": " and ", "+": " plus ", "@": " at ", "=": " equals ", "%": " percent ",
           "#": " number ", "$": " dollars ", "£": " pounds ", "€": " euros "}
CURRENCIES = {"$": ("dollar", "dollars", "cent", "cents"), "£": ("pound", "pounds", "penny", "pence"),
              "€": ("euro", "euros", "cent", "cents")}
DIGITS = "zero one two three four five six seven eight nine".split()
SCALES = r"(?:thousand|million|billion|trillion)"

_TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                            "\u2013": " - ", "\u2014": " - ", "\u00a0": " "})
_ABBREV_RE = re.compile(r"\b(" + "|".join(re.escape(a) for a in ABBREVIATIONS) + r")\.", re.IGNORECASE)
_ALNUM_RE = re.compile(r"(?<=[A-Za-z])(?=\d)|(?<=\d)(?=[A-Za-z])(?!(?:st|nd|rd|th|s)\b)")
_SHOUT_RE = re.compile(r"\b[A-Z][A-Z']*(?:[\s,.!?:;-]+[A-Z][A-Z']*\b){2,}")
_ACRONYM_RE = re.compile(r"\b[A-Z]{2,4}s?\b")
_MONEY_RE = re.compile(r"([$£€])\s?(\d[\d,]*)(?:\.(\d{1,2}))?(?:\s+(" + SCALES + r"))?\b")
_PERCENT_RE = re.compile(r"(\d[\d,]*(?:\.\d+)?)\s?%")
_CLOCK_RE = re.compile(r"\b(\d{1,2}):(\d{2})(?::\d{2})?(?:\s*([ap])\.?m\b\.?)?", re.IGNORECASE)
_HOUR_RE = re.compile(r"\b(\d{1,2})()\s*([ap])\.?m\b\.?", re.IGNORECASE)
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_PHONE_RE = re.compile(r"(\+1[-. ]?)?\(?\b(\d{3})\)?[-. ]?(\d{3})[-. ](\d{4})\b(?:\s?x\s?(\d+))?")
_PLAIN_RE = re.compile(r"\b\d{1,3}(?:,\d{3})+(?:\.\d+)?\b|\b\d+\.\d+\b")
_DECADE_RE = re.compile(r"\b(1[1-9]\d0|20\d0)'?s\b|(?<![\w'])'?([1-9]0)'?s\b")
_YEAR_RE = re.compile(r"\b(1[1-9]\d\d|20\d\d)\b")
_LONG_RE = re.compile(r"\b\d{5,}\b")
_INT_RE = re.compile(r"\d+")


def ascii_fold(text: str) -> str:
    """Typographic quotes and dashes to ASCII, accents dropped (café -> cafe)."""
    text = text.translate(_TYPOGRAPHY)
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def expand_abbreviations(text: str) -> str:
    """Mr. -> mister, e.g. -> for example, ... (only the dotted forms)."""
    return _ABBREV_RE.sub(lambda m: ABBREVIATIONS[m.group(1).lower()], text)


def split_alnum(text: str) -> str:
    """MP3 -> MP 3, 3D -> 3 D; ordinals (21st) and decades (1980s) stay whole."""
    return _ALNUM_RE.sub(" ", text)


def spell_acronyms(text: str) -> str:
    """FBI -> F B I, TVs -> T V's (three capital words in a row are shouting, not acronyms).

    Spelled: capitals without vowels (TV, HTML) and up to three letters that are not a common
    word (FBI, USA); others (NASA, ALL) are read as words.
    """
    text = _SHOUT_RE.sub(lambda m: m.group(0).lower(), text)
    def spell(m: re.Match[str]) -> str:
        word, plural = (m.group(0)[:-1], "'s") if m.group(0).endswith("s") else (m.group(0), "")
        if word == "OK":
            return "okay"
        if re.search(r"[AEIOU]", word) and (len(word) > 3 or word in CAPS_WORDS):
            return m.group(0)
        return " ".join(word) + plural
    return _ACRONYM_RE.sub(spell, text)


def cardinal(n: int) -> str:
    return num2words(n)


def digits(s: str) -> str:
    """Digit by digit: 4075 -> four zero seven five."""
    return " ".join(DIGITS[int(d)] for d in s if d.isdigit())


def year(n: int) -> str:
    """1984 -> nineteen eighty-four, 2005 -> two thousand and five."""
    return num2words(n, to="year")


def _money(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = CURRENCIES[m.group(1)]
    whole = int(m.group(2).replace(",", ""))
    cents = int(m.group(3).ljust(2, "0")) if m.group(3) else 0
    if m.group(4):
        amount = num2words(float(f"{whole}.{m.group(3) or 0}")) if cents else cardinal(whole)
        return f"{amount} {m.group(4)} {many}"
    words = f"{cardinal(whole)} {one if whole == 1 else many}"
    if cents:
        words += f" and {cardinal(cents)} {sub_one if cents == 1 else sub_many}"
    return words


def _number(s: str) -> str:
    """A plain number: grouped thousands, decimals, integers."""
    if "." in s:
        whole, frac = s.replace(",", "").split(".")
        return f"{cardinal(int(whole))} point {digits(frac)}"
    return cardinal(int(s.replace(",", "")))


def _time(m: re.Match[str]) -> str:
    """10:30 -> ten thirty, 7:05 -> seven oh five, 10:00 -> ten o'clock, 7pm -> seven p m."""
    hour, minute, ampm = int(m.group(1)), m.group(2), m.group(3)
    words = cardinal(hour)
    if minute and minute != "00":
        words += f" oh {cardinal(int(minute))}" if int(minute) < 10 else f" {cardinal(int(minute))}"
    elif minute and not ampm:
        words += " hundred" if hour > 12 or m.group(1).startswith("0") else " o'clock"
    return words + (f" {ampm.lower()} m" if ampm else "")


def _decade(m: re.Match[str]) -> str:
    """1980s -> nineteen eighties, '60s -> sixties."""
    words = year(int(m.group(1))) if m.group(1) else cardinal(int(m.group(2)))
    return words[:-1] + "ies" if words.endswith("y") else words + "s"


def _phone(m: re.Match[str]) -> str:
    words = "plus one " if m.group(1) else ""
    words += " ".join(digits(g) for g in m.group(2, 3, 4))
    return words + (f" extension {digits(m.group(5))}" if m.group(5) else "")


NUMBER_RULES: list[tuple[re.Pattern[str], Callable[[re.Match[str]], str]]] = [
    (_MONEY_RE, _money),
    (_PERCENT_RE, lambda m: f"{_number(m.group(1))} percent"),
    (_PHONE_RE, _phone),
    (_CLOCK_RE, _time),
    (_HOUR_RE, _time),
    (_ORDINAL_RE, lambda m: num2words(int(m.group(1)), to="ordinal")),
    (_PLAIN_RE, lambda m: _number(m.group(0))),
    (_DECADE_RE, _decade),
    (_YEAR_RE, lambda m: year(int(m.group(1)))),
    (_LONG_RE, lambda m: digits(m.group(0))),
    (_INT_RE, lambda m: cardinal(int(m.group(0)))),
]


def _spaced(rule: Callable[[re.Match[str]], str], m: re.Match[str]) -> str:
    return f" {rule(m)} "


def expand_numbers(text: str) -> str:
    """Money, percentages, phone numbers, times, ordinals, decimals, years and integers to words."""
    for pattern, rule in NUMBER_RULES:
        text = pattern.sub(partial(_spaced, rule), text)
    return text


def clean(text: str) -> str:
    """Lowercase; keep a-z, apostrophes inside words and single spaces."""
    text = re.sub(r"[^a-z']+", " ", text.lower())
    text = re.sub(r"(?<![a-z])'+|'+(?![a-z])", " ", text)
    return " ".join(text.split())


def normalize(text: str) -> str:
    """Raw text to a label: spelled-out numbers and symbols, lowercase a-z, apostrophes."""
    text = spell_acronyms(split_alnum(expand_abbreviations(ascii_fold(text))))
    text = expand_numbers(text)
    for symbol, words in SYMBOLS.items():
        text = text.replace(symbol, words)
    return clean(text)
