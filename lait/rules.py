"""How a stage's rules drop a row: a `Filter` keeps a record or names why it drops it, and
`first_rejection` reads a list of them the one way, naming the rule as a `Drop`; deep inside a
decoder, a `Rejected` exception carries the rule up to the stage's loop over its rows. Either
way the stage records the drop with `lait.parts.PartContext.reject`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

KeepResult = bool | tuple[bool, str] | tuple[bool, str, str]


class Filter(ABC):
    """A rule that keeps a record or names why it drops it.

    `keep` returns True, or `(False, detail)`; `first_rejection` reads it, and the stage records
    the drop as `STAGE/NAME` with the detail (`PartContext.reject`). A filter whose one test
    tells several rules apart (stage 2's fetch status, its sniffing of the bytes) lists them in
    `rules` and returns `(False, detail, rule)`.
    """

    name: ClassVar[str]
    rules: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def keep(self, record: Any) -> KeepResult: ...


class RegexFilter(Filter):
    """A rule that drops a record whose text matches `pattern`; the detail is the match (its
    first `detail_chars` characters when set). `text_of` picks the text (default: `.text`)."""

    pattern: ClassVar[re.Pattern[str]]
    detail_chars: ClassVar[int | None] = None

    def text_of(self, record: Any) -> str:
        return record.text

    def surely_kept(self, text: str) -> bool:
        """Whether `text` cannot match, known without the pattern (a cheaper pre-check a rule
        may define; by default the pattern always decides)."""
        return False

    def keep(self, record: Any) -> KeepResult:
        text = self.text_of(record)
        if self.surely_kept(text):
            return True
        m = self.pattern.search(text)
        return m is None or (False, m.group(0)[: self.detail_chars])


class Drop(NamedTuple):
    """Why a record is dropped: the rule (a `Filter`'s name, or one of its `rules`) and the detail."""

    rule: str
    detail: str | None


def read_verdict(result: KeepResult) -> tuple[bool, str | None, str | None]:
    """A `Filter.keep` result as (kept, detail, rule): True, False, a `(kept, detail)` pair, or
    `(False, detail, rule)` of a filter with several `rules` (else the rule is None)."""
    if isinstance(result, tuple):
        return bool(result[0]), result[1], result[2] if len(result) > 2 else None
    return bool(result), None, None


def first_rejection(filters: Sequence[Filter], record: Any) -> Drop | None:
    """Why the first filter that drops `record` drops it; None when every filter keeps it."""
    for f in filters:
        kept, detail, rule = read_verdict(f.keep(record))
        if not kept:
            return Drop(rule or f.name, detail)
    return None


class Rejected(Exception):
    """A record dropped deep inside a step; the loop over records passes `rule` and `detail`
    to `PartContext.reject`."""

    def __init__(self, rule: str, detail: str = ""):
        super().__init__(f"{rule}: {detail}")
        self.rule = rule
        self.detail = detail
