"""Stage 3 rules for texts that pages put near images but that describe nothing: credits and
bylines, share and social buttons, dates and teasers, addresses and contact lines, cookie,
newsletter and advertising text, and navigation.

Each rule is a `lait.stage.Filter` over a `lait.filters.text_rules.Candidate` with its own
`clean/RULE` reason (registered in `lait.reasons`). They were written against the tune half of
`bench/captions/labelled.json` (real pages of ../shared/data, labelled by its README's rules)
and judged on the other half by `bench/captions/bench_captions.py`. A rule drops a text whose
form is the thing itself (a credit line, a share button), not a caption that merely ends with
a credit: "Smoke billows from a chimney ... (AP Photo/Luca Bruno)" is kept.
"""

from __future__ import annotations

import re

from lait.rules import Filter, KeepResult, RegexFilter

# -- credits and bylines -------------------------------------------------------------------

# A text that starts as a credit does: "Photo: Reuters", "Credit Kim Raff for The New York
# Times", "Courtesy Google", "Photos by ...", "Image via ...", "(Credit: iStock)".
_CREDIT_LEAD = re.compile(
    r"^\(?\s*(?:(?:photo|image|picture|graphic|illustration|video|foto|bild)s?\s*(?:credits?|courtesy)?"
    r"\s*(?::|by\b|via\b|from\b|courtesy\b|©)|credits?\b|courtesy\b|copyright\b|©|\(c\)\s|source\s*:"
    r"|(?:photograph|photography|fotografía|fotografia)\s*(?::|by\b|de\b)|pictured\s*:)", re.I)
# Licence attributions as Wikimedia Commons and Flickr write them.
_LICENCE = re.compile(r"\[\s*CC[ -]?(?:BY|0)[^\]]*\]|\bvia Wikimedia Commons\b|\bCC[ -]BY(?:-[A-Z]{2})*\s+\d", re.I)
# "By Jane Doe", "Posted by ...", "Written by ..." at the start: a byline.
_BYLINE = re.compile(r"^(?i:(?:posted|written|published|reported|edited|updated|story|text)\s+by|by)\s+"
                     r"(?:[A-Z@][\w.'’-]*|de\b|van\b|von\b|m\d)", re.U)
# Image-agency and photographer markers: what the rest of a short credit is made of.
_AGENCY = re.compile(r"\b(?:getty(?: images)?|reuters|afp|ap photo|associated press|epa|shutterstock|istock"
                     r"|alamy|dpa|xinhua|pa images|pa wire|bloomberg|handout|file photo|supplied)\b|/", re.I)
_CREDIT_MAX_WORDS = 14


_SMALL_WORDS = frozenset("a an and by de del des di du e et for from für in la las le les los of on para "
                         "por the und van via von y".split())


def _names(text: str) -> bool:
    """Whether a text reads as names (a photographer, an agency): a few words, most capitalised."""
    words = [w for w in re.findall(r"[^\W\d_][\w'’.-]*", text) if w.lower() not in _SMALL_WORDS]
    return 0 < len(words) <= 6 and sum(w[0].isupper() for w in words) >= 0.75 * len(words)


class CreditFilter(Filter):
    """Credits, bylines and licence attributions standing alone."""

    name = "credit"

    def keep(self, c) -> KeepResult:
        text = c.text.strip()
        words = len(text.split())
        if _LICENCE.search(text) and (_BYLINE.match(text) or _CREDIT_LEAD.match(text) or words <= 12):
            return False, "licence attribution"
        m = _CREDIT_LEAD.match(text)
        if m and (words <= _CREDIT_MAX_WORDS or _AGENCY.search(text) or text.count(",") >= 3):
            lead, rest = m.group(0).strip(), text[m.end():].strip()
            # "Photo: Joseph Cox" is a credit; "photo : un petit triangle violet ..." a caption.
            if not lead.endswith(":") or _names(rest) or _AGENCY.search(rest):
                return False, f"credit: {lead!r}"
        if _BYLINE.match(text) and words <= 12:
            return False, "byline"
        return True


# -- share and social buttons ---------------------------------------------------------------

_NETWORK = (r"facebook|twitter|instagram|pinterest|linkedin|whatsapp|youtube|tiktok|reddit|tumblr"
            r"|snapchat|telegram|feedly|flipboard|google\s*\+|google plus|rss|e-?mail|messenger|vk")
_SOCIAL_ACTION = re.compile(
    rf"\b(?:share|tweet|pin|like|follow|join|subscribe|connect|find)\b.{{0,40}}\b(?:{_NETWORK})\b"
    r"|^(?:share|tweet|pin it|email this|print this|send this|share this|follow us)\b", re.I)
# A network's name with at most a word either side, or with the button words: short texts only.
_NETWORK_ONLY = re.compile(rf"^(?:\w+\s+)?(?:{_NETWORK})(?:\s+\w+)?$"
                           rf"|\b(?:{_NETWORK})\b.{{0,12}}\b(?:share|icon|button|logo|page|feed)\b", re.I)
_SOCIAL_MAX_WORDS = 25
# Words that every match of the two patterns above holds (a network's name), or starts with.
_SOCIAL_WORDS = ("facebook", "twitter", "instagram", "pinterest", "linkedin", "whatsapp", "youtube", "tiktok",
                 "reddit", "tumblr", "snapchat", "telegram", "feedly", "flipboard", "google", "rss", "mail",
                 "messenger", "vk")
_SOCIAL_STARTS = ("share", "tweet", "pin it", "print this", "send this", "follow us")


def _surely_not(text: str, words: tuple[str, ...], starts: tuple[str, ...] = ()) -> bool:
    """Whether an ASCII text holds none of `words` and starts with none of `starts` (lower-case
    words that every match of a rule's patterns holds or starts with): the rule keeps it without
    its patterns, which cost ten times as much. Beyond ASCII, case folding in a pattern reaches
    further than `str.lower` (the long s, the Kelvin sign), so the patterns decide."""
    if not text.isascii():
        return False
    low = text.lower()
    return not low.startswith(starts) and not any(w in low for w in words)
_NETWORK_MAX_WORDS = 5


class SocialFilter(Filter):
    """Share, follow and like buttons and social network names."""

    name = "social"

    def keep(self, c) -> KeepResult:
        text = c.text.strip().rstrip("!.:")
        if len(text.split()) > _SOCIAL_MAX_WORDS or _surely_not(text, _SOCIAL_WORDS, _SOCIAL_STARTS):
            return True
        m = _SOCIAL_ACTION.search(text)
        if m is None and len(text.split()) <= _NETWORK_MAX_WORDS:
            m = _NETWORK_ONLY.search(text)
        return m is None or (False, m.group(0)[:40])


# -- dates and teasers ---------------------------------------------------------------------

_MONTH = (r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
          r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?")
_DATE_PARTS = re.compile(
    rf"\b(?:\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}(?:,?\s+\d{{4}})?|{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?"
    rf"|{_MONTH}\s+\d{{4}}|\d{{1,4}}[./-]\d{{1,2}}[./-]\d{{2,4}}|\d{{1,2}}:\d{{2}}(?:\s*[ap]\.?m\.?)?"
    r"|(?:mon|tues|wednes|thurs|fri|satur|sun)day|today|yesterday|\d{4}|[ap]\.?m\.?|[A-Z]{2,4}T|GMT|UTC)\b", re.I)
_RELATIVE = re.compile(r"\b\d+\s*(?:sec(?:ond)?s?|min(?:ute)?s?|h(?:ou)?rs?|hours?|days?|weeks?|months?|years?)"
                       r"\s+ago\b|\bjust now\b", re.I)
_UPDATED = re.compile(r"^(?:last\s+)?(?:updated|published|posted|modified)\b.{0,12}"
                      rf"(?:{_MONTH}|\d)", re.I)
_FILLER = re.compile(r"[\W_]+|\b(?:on|at|the|of|et|and|updated|published|posted|last|date|time)\b", re.I)
# What decides that a text is more than a date without the two substitutions (most texts are
# sentences, and the substitutions cost ten times as much as these tests). A date part and a
# filler word match from one word boundary to another, so each run of letters and digits of the
# text is either inside one match whole or left over; one that no match can hold is left over.
# In ASCII, the runs a match holds are these words:
_DATE_WORD = re.compile(
    r"[0-9]{1,4}|[0-9]{1,2}(?:st|nd|rd|th)|[0-9]{2}[ap]m?|[ap]m?|m|jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?"
    r"|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
    r"|(?:mon|tues|wednes|thurs|fri|satur|sun)day|today|yesterday|[a-z]{2,4}t|gmt|utc"
    r"|on|at|the|of|et|and|updated|published|posted|last|date|time", re.I)
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]+")
# Beyond ASCII (where case folding and digits reach further), only the length: no run a match
# holds is longer than 9 ("september", "wednesday", "yesterday", "published").
_LONG_RUN = re.compile(r"[^\W_]{10}")


def _more_than_a_date(text: str) -> bool:
    """True when a text surely holds more than date parts and filler words (False: it may not)."""
    if text.isascii():
        return any(_DATE_WORD.fullmatch(run) is None for run in _ALNUM_RUN.findall(text))
    return _LONG_RUN.search(text) is not None


class DateFilter(Filter):
    """Dates and timestamps standing alone, and teasers that end in one ("... 2 hours ago")."""

    name = "date"

    def keep(self, c) -> KeepResult:
        text = c.text.strip()
        m = _RELATIVE.search(text)
        if m and m.end() >= len(text.rstrip(" .)]")) - 1:
            return False, f"teaser ending {m.group(0)!r}"
        if _UPDATED.match(text) and len(text.split()) <= 10:
            return False, "timestamp"
        if _more_than_a_date(text):
            return True
        rest = _FILLER.sub(" ", _DATE_PARTS.sub(" ", text)).strip()
        if not rest and _DATE_PARTS.search(text):
            return False, "only a date"
        return True


# -- addresses and contact lines -----------------------------------------------------------

_PHONE = re.compile(r"(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}\b")
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+\.[\w.]+\b")
_CONTACT_WORD = re.compile(r"\b(?:tel|phone|telephone|fax|e-?mail|contact us|call us|write to us|p\.?\s?o\.? box"
                           r"|postal address|opening hours|directions)\b", re.I)
_STREET = re.compile(r"\b\d{1,5}[a-z]?\s+(?:[A-Z][\w.'-]*\s+){1,4}(?:street|st|avenue|ave|road|rd|boulevard|blvd"
                     r"|drive|dr|lane|ln|way|place|pl|square|sq|suite|court|ct|parkway|pkwy|highway|hwy)\b\.?", re.I)
_POSTCODE = re.compile(r"\b[A-Z]{2}\s+\d{5}(?:-\d{4})?\b|\b[A-Z]{1,2}\d[A-Z\d]?\s+\d[A-Z]{2}\b|\b\d{5}\s+[A-Z][a-z]+")
_CONTACT_MAX_WORDS = 20


class ContactFilter(Filter):
    """Postal addresses, phone numbers, e-mail addresses and contact lines."""

    name = "contact"

    def keep(self, c) -> KeepResult:
        text = c.text.strip()
        if len(text.split()) > _CONTACT_MAX_WORDS:
            return True
        for what, rx in (("e-mail address", _EMAIL), ("phone number", _PHONE)):
            if rx.search(text):
                return False, what
        street = _STREET.search(text)
        if street and (_POSTCODE.search(text) or _CONTACT_WORD.search(text) or len(text.split()) <= 10):
            return False, f"address {street.group(0)!r}"
        m = _CONTACT_WORD.search(text)
        if m and len(text.split()) <= 8:
            return False, f"contact line {m.group(0)!r}"
        return True


# -- cookie, newsletter, subscription and advertising text ----------------------------------

# Every alternative starts at a word boundary (the `^` ones with a letter), so `\b` stands once
# in front: the engine then tries the alternatives at word starts only, five times faster.
_PROMO = re.compile(
    r"\b(?:cookies?\b.{0,60}\b(?:use|accept|consent|policy|settings|browser|experience)\b"
    r"|(?:we|this site|this website)\s+uses?\s+cookies\b"
    r"|newsletters?\b|^sign(?:ing)?[ -]?up\b|sign[ -]?up (?:for|to|now|today|here)\b|subscribe\b|subscription\b|unsubscribe\b"
    r"|delivered (?:to|through) your (?:inbox|letterbox|door)\b|in your inbox\b"
    # Advertising words mark a promo where they label the text, not where a caption mentions an
    # advert ("A man walks past an advertisement for ..." is a caption).
    r"|^(?:advertisement|advertising|advertorial|sponsored|promoted|paid (?:content|post|partnership))\b"
    r"|(?:sponsored|promoted|paid) (?:content|posts?|links?|stories|story|partnership|by)\b"
    r"|advertising (?:feature|partner|disclosure|policy)\b|affiliate (?:links?|commissions?|partners?|programs?)\b"
    r"|(?:continues?|continued) (?:below|after|under) (?:the |this )?(?:advertisement|advert|ad)\b"
    r"|may earn (?:a )?commission\b"
    r"|disclosure:|all rights reserved\b|may not be (?:published|reproduced|redistributed)\b"
    r"|privacy policy\b|terms of (?:use|service)\b"
    r"|(?:use|enter) (?:the )?(?:promo |coupon |discount )?code\b|available on (?:the )?app store\b"
    r"|get it on google play\b|download (?:the|our) app\b|free trial\b|buy now\b|shop now\b"
    r"|order now\b|book now\b|deal of the day\b|cyber monday\b|^deal:|deal$"
    r"|(?:special|festive|exclusive|limited|holiday) offers?\b|upgrade to (?:premium|pro|plus)\b"
    r"|^get\b.{0,60}\bfor free\b|^get (?:started|the recipe|the app|yours|your free|it now)\b)", re.I)


# Words that every match of `_PROMO` holds, one for each of its alternatives.
_PROMO_WORDS = ("cookie", "newsletter", "sign", "subscri", "delivered", "inbox", "advert", "sponsored", "promoted",
                "paid", "affiliate", "continue", "commission", "disclosure:", "rights reserved", "may not be",
                "privacy policy", "terms of", "code", "app store", "google play", "download", "free trial",
                "buy now", "shop now", "order now", "book now", "deal", "cyber monday", "offer", "upgrade to",
                "for free", "get ")


class PromoFilter(RegexFilter):
    """Cookie notices, newsletter and subscription prompts, advertising and legal lines."""

    name = "promo"
    pattern = _PROMO
    detail_chars = 40

    def surely_kept(self, text: str) -> bool:
        return _surely_not(text, _PROMO_WORDS)


# -- navigation and interface text ----------------------------------------------------------

# Navigation texts as they start (tried at the start of the text only, with `match`) ...
_NAVIGATION = re.compile(
    r"(?:read|see|view|show|load|watch|click|tap|learn|discover|find out|explore|continue|go)\b.{0,10}"
    r"\b(?:more|also|all|here|original|full|next|previous|gallery|article|story|video|comments?)\b"
    r"|(?:read more|see more|see also|related|recommended|you (?:may|might) also like|more from|more on|most "
    r"(?:read|popular|viewed|shared)|trending|top stories|external links|further reading|references"
    r"|leggi anche|lire aussi|lesen sie auch|ver también|leia também)\b"
    r"|edit this\b|tell us what you think|leave a (?:comment|reply)|\d+\s+comments?$"
    r"|(?:un)?fold all\b|(?:back to top|skip to content|next|previous|menu|search|home|close|loading|please wait"
    r"|play video|watch video|click to (?:play|expand|enlarge|zoom)|open (?:gallery|in new (?:tab|window)))$"
    r"|test case\b"
    r"|(?:save|print|download|edit|submit|cancel|reset|zoom in|zoom out|expand|collapse)(?:\s+\w+)?$", re.I)
# ... and anywhere in it. Two patterns, not one: in one, every alternative anchored with `^` was
# tried again at every position of every text. No text matches one of each at its start
# ("[edit]", "tooltip..."), so the first match is the one the single pattern found.
_NAVIGATION_ANYWHERE = re.compile(r"\[edit\]$|\btooltip\b", re.I)


class NavigationFilter(Filter):
    """Navigation, read-more prompts and interface labels."""

    name = "navigation"

    def keep(self, c) -> KeepResult:
        text = c.text.strip().rstrip(":.!…?").strip()
        m = _NAVIGATION.match(text) or _NAVIGATION_ANYWHERE.search(text)
        return m is None or (False, m.group(0)[:40])


# -- markup and placeholder text -------------------------------------------------------------

_MARKUP = re.compile(r"\\[a-zA-Z]+\s*\{|\{\\|</?[a-z][a-z0-9]*[\s/>]|\$\$|&[a-z]+;|\{\{|\}\}")
_BRACKETED = re.compile(r"^\[[^\[\]]{1,60}\]$")  # "[MP3 SP]": a tag, not a sentence
_LOREM = frozenset(
    "lorem ipsum dolor sit amet consectetur consectetuer adipiscing adipisicing elit sed eiusmod tempor "
    "incididunt labore dolore magna aliqua enim minim veniam quis nostrud exercitation ullamco laboris nisi "
    "aliquip commodo consequat duis aute irure reprehenderit voluptate velit esse cillum fugiat nulla "
    "pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui officia deserunt mollit anim "
    "laborum rerum necessitatibus deleniti odio earum voluptatum eos modi minus voluptas quibusdam".split())


class MarkupFilter(Filter):
    """TeX or HTML markup and lorem-ipsum placeholder text."""

    name = "markup"

    def keep(self, c) -> KeepResult:
        m = _MARKUP.search(c.text)
        if m:
            return False, f"markup {m.group(0)!r}"
        if _BRACKETED.match(c.text.strip()):
            return False, "a bracketed label"
        words = re.findall(r"[a-z]+", c.text.lower())
        lorem = sum(w in _LOREM for w in words)
        if words and lorem >= 3 and lorem / len(words) >= 0.5:
            return False, "lorem ipsum placeholder"
        return True


def junk_filters() -> list[Filter]:
    """The rules of this module, in the order stage 3 applies them."""
    return [MarkupFilter(), CreditFilter(), SocialFilter(), PromoFilter(), NavigationFilter(),
            ContactFilter(), DateFilter()]
