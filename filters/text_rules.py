"""Text cleaning for stage 3: Unicode repair, sentence splitting, language ID and the rules.

Each rule is a `lait.stage.Filter` over a `Candidate` and names its drop reason; `CleanStage`
records a dropped text as `clean/RULE` with the text itself, so the funnel shows what went.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from lait.rules import Filter, KeepResult, RegexFilter, first_rejection

# Abbreviations that end with a dot inside a sentence.
_ABBREV = re.compile(r"\b(?:Mr|Mrs|Ms|Dr|Prof|Sr|Jr|St|Mt|vs|etc|No|Fig|Figs|Inc|Ltd|Co|Corp|Gen|Gov|"
                     r"Sen|Rep|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec|approx|ca|e\.g|i\.e|"
                     r"U\.S|U\.K|z\.B|bzw|usw|Nr|Abb)\.$", re.I)
_INITIAL = re.compile(r"\b[A-Z]\.$")  # "J. Smith"
_SPLIT = re.compile(r"(?<=[.!?…。！？])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9À-ÝĀ-ſА-Я¿¡])")
_URL = re.compile(r"(https?://|www\.)\S+|\b[\w-]+\.(com|org|net|de|fr|co\.uk|io|html?|php)\b", re.I)
_FILENAME = re.compile(r"(\.(jpe?g|png|gif|webp|bmp|svg|tiff?|heic|avif)\b)|"
                       r"^(img|dsc|dscn|dcim|pxl|screenshot|photo|image|pic)[\s_-]?\d{2,}", re.I)
# A text that ends in an ellipsis was cut short by the site (og descriptions, teasers):
# "The storm passed over the isl…", "... the wind had dropped...", "[...]".
_CUT_END = re.compile(r"(?:…|\.\s?\.\s?\.|\[(?:…|\.\.\.)\])[\"'”’)\]]*$")
_REPEAT_CHARS = re.compile(r"(\S)\1{4,}")
_WORD = re.compile(r"\w+", re.U)

# Texts that say nothing about a picture, compared lower-cased without punctuation.
BOILERPLATE = frozenset({
    "image", "images", "photo", "photos", "picture", "pictures", "pic", "img", "logo", "icon",
    "thumbnail", "thumb", "banner", "placeholder", "untitled", "avatar", "spacer", "blank", "alt",
    "click here", "click to enlarge", "click to zoom", "read more", "more", "no image",
    "untitled image", "image description", "featured image", "header image", "main image",
    "hero image", "cover image", "profile picture", "image may contain", "photo credit",
    "share", "print", "mail", "email", "rss", "facebook", "twitter", "linkedin", "pinterest",
    "instagram", "youtube", "whatsapp", "loading", "advertisement", "null", "undefined", "none",
    "default"})
_NUMBERED = re.compile(r"^(image|photo|picture|img|pic|slide|figure|fig|bild|foto|imagem|imagen)\s*\d*$")
# A short text naming a piece of site furniture: "Snopes Logo", "rss icon", "print header logo".
_FURNITURE = re.compile(r"\b(logo|logos|icon|icons|banner|avatar|headshot|thumbnail|placeholder|spacer|"
                        r"sprite|button|badge|emoji|image for post|foto facebook)$")
# A short text that calls its picture a logo or a banner anywhere, in a word of its own or at the
# end of a compound: "Logo Capital Digital", "Trust Logos for FinCompare", "... GmbH-Firmenlogo",
# "Belize Weather Banner - Travellers Liquor" (a longer caption mentioning a logo describes a scene).
_NAMES_FURNITURE = re.compile(r"logos?\b|\bbanner\b")


# Bidirectional controls: embeddings and overrides (U+202A-U+202E), isolates (U+2066-U+2069),
# the LRM/RLM marks (U+200E, U+200F) and the Arabic letter mark (U+061C). A caption carrying
# them shows other text than it holds ("gnp.exe" displayed as "exe.png"); ftfy keeps them.
_BIDI_CONTROLS = dict.fromkeys([*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C])


# Texts that `repair` hands to ftfy: those holding a character other than printable ASCII
# (without "&", which may start an HTML entity), tab, line feed, form feed, carriage return and
# the characters below. ftfy leaves each of these as it is, or only straightens it (the curly
# quotes), whatever stands around it: the punctuation is in its mojibake heuristic as "common",
# start or end punctuation only, and each mojibake pattern holding one of those needs another
# character outside this set (an accented letter, a currency, box or numeric sign, a C1
# control); the CJK ideographs, kana and Hangul syllables are in none; none is changed by its
# width, ligature and control-character fixes or by NFC (no combining mark is among them).
# tests/filters/test_clean_repair.py checks this against ftfy itself.
_NEEDS_FTFY = re.compile(
    "[^\t\n\x0c\r\x20-\x25\x27-\x7e"
    "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00a0\u00a9\u2022\u00ab\u00bb"  # ‘ ’ “ ” – — … nbsp © • « »
    "\u3001\u3002\u300c-\u300f\u3041-\u3096\u30a1-\u30fa\u30fc"  # 、 。 「 」 『 』, hiragana, katakana, ー
    "\u4e00-\u9fff\uac00-\ud7a3]")  # CJK unified ideographs, Hangul syllables
_STRAIGHTENED = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def repair(text: str) -> str:
    """Unicode repair (mojibake, HTML entities left over, odd spaces), bidirectional control
    characters removed, and whitespace folding: the one place stage 3 normalises a text."""
    if not _NEEDS_FTFY.search(text):  # what ftfy gives, 20 times faster (ftfy is slow)
        return " ".join((text if text.isascii() else text.translate(_STRAIGHTENED)).split())
    return repair_with_ftfy(text)


def repair_with_ftfy(text: str) -> str:
    """`repair` of any text by ftfy itself (what `repair`'s shortcuts must equal)."""
    import ftfy

    text = ftfy.fix_text(text, unescape_html=True, normalization="NFC").translate(_BIDI_CONTROLS)
    return " ".join(text.split())


def split_sentences(text: str) -> list[str]:
    """Sentences of a paragraph: split after . ! ? before a capital, unless an abbreviation."""
    out: list[str] = []
    start = 0
    for m in _SPLIT.finditer(text):
        head = text[start:m.start()].rstrip("\"'”’)]")
        # Both end at the end of `head` and are at most 8 characters long: searching its last
        # 16 spares scanning a long head (a search from `pos` still sees the character before).
        tail = max(0, len(head) - 16)
        if _ABBREV.search(head, tail) or _INITIAL.search(head, tail):
            continue
        out.append(text[start:m.start()].strip())
        start = m.end()
    tail = text[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def uncut(text: str, page_text: Callable[[], str], *, mid_word: bool = False) -> str | None:
    """The whole of a text the site cut short, taken from its page's text; None when the text
    is not cut or its page does not hold it.

    Cut: it ends in an ellipsis, or (`mid_word`, for og texts, which sites cut to a length) it
    stops inside a word of the page: the page has it followed by a letter. The whole text runs
    from where the cut one starts in the page to the end of the sentence it was cut in.
    `page_text` is called only for a text that looks cut."""
    m = _CUT_END.search(text)
    if m is not None:
        stem = text[:m.start()].rstrip()
    elif mid_word and text[-1:].isalnum() and len(text.split()) >= 4:
        stem = text
    else:
        return None
    if len(stem.split()) < 2:
        return None
    page = page_text()
    start = page.find(stem)
    if start < 0:
        return None
    end = start + len(stem)
    if m is None and (end >= len(page) or not page[end].isalnum()):
        return None  # the page's sentence ends (or goes on) where the text does: not cut
    whole = ""
    for sentence in split_sentences(page[start:end + 2000]):
        whole = f"{whole} {sentence}" if whole else sentence
        if len(whole) > len(stem):
            break
    if len(whole) <= len(stem) or _CUT_END.search(whole):
        return None
    return whole


@dataclass
class Candidate:
    """One candidate text of one image on one page."""

    text: str
    source: str  # alt, title, figcaption, aria, og, context
    image_url: str
    page_url: str
    lang: str | None = None
    prior: str | None = None  # the language its page or list declares (`lait.filters.langid.declared`)


def _plain(text: str) -> str:
    return " ".join(_WORD.findall(text.lower())).replace("_", " ")


class CutFilter(RegexFilter):
    """A text that ends in an ellipsis: cut short, and not found whole in its page (stage 3
    mends the ones it finds, `uncut`)."""

    name = "cut"
    pattern = _CUT_END


class WordCountFilter(Filter):
    name = "word_count"

    def __init__(self, min_words: int, max_words: int):
        self.min_words, self.max_words = min_words, max_words

    def keep(self, c: Candidate) -> KeepResult:
        n = len(c.text.split())
        return self.min_words <= n <= self.max_words or (False, f"{n} words, not in [{self.min_words}, {self.max_words}]")


class LetterShareFilter(Filter):
    name = "letters"

    def __init__(self, min_share: float):
        self.min_share = min_share

    def keep(self, c: Candidate) -> KeepResult:
        chars = "".join(c.text.split())  # str.split() and str.isspace() agree on whitespace
        share = sum(map(str.isalpha, chars)) / max(1, len(chars))
        return share >= self.min_share or (False, f"{share:.2f} letters < {self.min_share}")


class UrlFilter(RegexFilter):
    name = "url"
    pattern = _URL


class FileNameFilter(RegexFilter):
    name = "filename"
    pattern = _FILENAME

    def text_of(self, c: Candidate) -> str:
        return c.text.strip()


class BoilerplateFilter(Filter):
    name = "boilerplate"

    def keep(self, c: Candidate) -> KeepResult:
        plain = _plain(c.text)
        if plain in BOILERPLATE or _NUMBERED.match(plain):
            return False, plain
        if len(plain.split()) <= 5 and (_FURNITURE.search(plain) or _NAMES_FURNITURE.search(plain)
                                        or plain.startswith(("headshot", "avatar"))):
            return False, plain
        return True


class RepetitionFilter(Filter):
    name = "repetition"

    def keep(self, c: Candidate) -> KeepResult:
        m = _REPEAT_CHARS.search(c.text)
        if m and not m.group(1).isdigit():
            return False, f"{m.group(0)[:20]!r} repeated"
        words = c.text.lower().split()
        for a, b, d in zip(words, words[1:], words[2:]):
            if a == b == d:
                return False, f"{a!r} three times in a row"
        if len(words) >= 6 and len(set(words)) / len(words) < 0.5:
            return False, f"{len(set(words))} distinct of {len(words)} words"
        return True


class LanguageFilter(Filter):
    """Keeps texts in the configured languages; sets `Candidate.lang` to the detected code.

    The detector chooses among all the languages it knows (`lait.filters.langid`), so a
    Polish caption is `pl`, never the nearest of a few kept languages. Repeated texts are
    spared by `TextRules`, which asks once per text.
    """

    name = "language"

    def __init__(self, languages: list[str]):
        from lait.filters.langid import canonical, detect

        self.languages = frozenset(canonical(c) for c in languages)
        self._detect = detect

    def keep(self, c: Candidate) -> KeepResult:
        code = self._detect(c.text, c.prior)[0]
        c.lang = code
        return code in self.languages or (False, f"language {code}")


def text_filters(*, min_words: int, max_words: int, min_letter_share: float,
                 languages: list[str]) -> list[Filter]:
    """The cleaning rules in the order they run (cheapest first, language ID last)."""
    from lait.filters.text_junk import junk_filters

    rules: list[Filter] = [FileNameFilter(), UrlFilter(), BoilerplateFilter(), CutFilter(),
                           WordCountFilter(min_words, max_words), LetterShareFilter(min_letter_share),
                           RepetitionFilter(), *junk_filters()]
    if languages and languages != ["any"]:
        rules.append(LanguageFilter(languages))
    return rules


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the rules say of one text: `rule` and `detail` of the first rule that drops it
    (`rule` None when every rule keeps it), and the language `LanguageFilter` found."""

    rule: str | None
    detail: str | None
    lang: str | None


class TextRules:
    """`text_filters` as one chain that judges each distinct text once.

    Every rule reads `Candidate.text` alone (the language rule also its `prior`, part of the key), and one text comes back many times (the alt of a
    logo on every page of a site, a caption given to each URL of a srcset): its verdict is
    kept, so the rules run once per text. The rules, their order and their reasons are those
    of the list; only the repeats are spared.
    """

    MAX_TEXTS = 200_000  # bounds the memory of a long run; the cache starts again past it

    def __init__(self, rules: list[Filter]):
        self.rules = rules
        self._verdicts: dict[tuple[str, str | None], Verdict] = {}

    def judge(self, text: str, prior: str | None = None) -> Verdict:
        """The verdict on `text`, whose page or list declares the language `prior` (or None)."""
        verdict = self._verdicts.get((text, prior))
        if verdict is None:
            verdict = self._judge(text, prior)
            if len(self._verdicts) >= self.MAX_TEXTS:
                self._verdicts.clear()
            self._verdicts[(text, prior)] = verdict
        return verdict

    def _judge(self, text: str, prior: str | None) -> Verdict:
        c = Candidate(text, "", "", "", prior=prior)
        dropped = first_rejection(self.rules, c)
        if dropped is not None:
            return Verdict(dropped.rule, dropped.detail, c.lang)
        return Verdict(None, None, c.lang)

