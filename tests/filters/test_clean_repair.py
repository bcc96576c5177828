"""`repair`'s shortcut past ftfy: texts of ASCII, common punctuation, CJK ideographs, kana and
Hangul syllables come out as ftfy itself would give them (`repair_with_ftfy`)."""

from __future__ import annotations

import itertools
import random

import pytest

import lait.filters.text_rules as text_rules
from lait.filters.text_rules import _NEEDS_FTFY, repair, repair_with_ftfy

PUNCTUATION = "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00a0\u00a9\u2022\u00ab\u00bb\u3001\u3002\u300c\u300f\u30fc"
SCRIPTS = "\u4e00\u9fff\u3041\u3096\u30a1\u30fa\uac00\ud7a3"
ASCII = "aZ1. '\"\t\r\n\x0c"
# Characters around them that ftfy does change or that its mojibake patterns need.
OTHERS = "é\u00c3\u00c2\u20ac\u00b2\u2500\u201a\u00ad\u0301\u3099\u3000\uff0c\u11a8\u0432\u00d8&\x01\x85\u2028\u202e"


def test_every_short_text_of_the_shortcut_characters_is_what_ftfy_gives():
    alphabet = PUNCTUATION + SCRIPTS + ASCII
    for n in (1, 2, 3):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            assert not _NEEDS_FTFY.search(text)
            assert repair(text) == repair_with_ftfy(text), repr(text)


def test_every_character_of_the_scripts_is_what_ftfy_gives():
    ranges = [(0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3)]
    chars = [chr(c) for lo, hi in ranges for c in range(lo, hi + 1)]
    for i in range(0, len(chars), 64):
        text = "a\u2019" + "\u201c".join(chars[i:i + 64]) + "\u201d."
        assert repair(text) == repair_with_ftfy(text)


def test_random_mixed_texts_are_what_ftfy_gives_whichever_way_they_go():
    rng = random.Random(7)
    alphabet = PUNCTUATION + SCRIPTS + ASCII + "abcdefghij ,;:!?()"
    shortcut = 0
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
        if rng.random() < 0.3:  # one character the shortcut must hand to ftfy
            i = rng.randint(0, len(text))
            text = text[:i] + rng.choice(OTHERS) + text[i:]
        shortcut += not _NEEDS_FTFY.search(text)
        assert repair(text) == repair_with_ftfy(text), repr(text)
    assert 10_000 < shortcut < 20_000  # both ways were taken


@pytest.mark.parametrize("text, expected", [
    ("It\u2019s a \u201cdog\u201d \u2013 \u00a9 2020\u2026", "It's a \"dog\" \u2013 \u00a9 2020\u2026"),
    ("\u6771\u4eac\u306e\u591c\u666f\u3002 \u30bf\u30ef\u30fc", "\u6771\u4eac\u306e\u591c\u666f\u3002 \u30bf\u30ef\u30fc"),
    ("\uc11c\uc6b8\u00a0\ud0c0\uc6cc", "\uc11c\uc6b8 \ud0c0\uc6cc"),
])
def test_the_shortcut_does_not_call_ftfy(monkeypatch, text, expected):
    def refuse(text):
        raise AssertionError(f"ftfy called for {text!r}")

    monkeypatch.setattr(text_rules, "repair_with_ftfy", refuse)
    assert repair(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("don\u00e2\u20ac\u2122t", "don't"),  # mojibake of ’, then straightened
    ("caf\u00e9 &amp; bar", "caf\u00e9 & bar"),  # an entity
    ("\uff21\uff22 x", "AB x"),  # fullwidth letters
    ("ok\x01 then", "ok then"),  # a control character
])
def test_texts_outside_the_shortcut_are_repaired_by_ftfy(text, expected):
    assert _NEEDS_FTFY.search(text)
    assert repair(text) == expected
