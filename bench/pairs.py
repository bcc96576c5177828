"""One lait figure beside its peer's, measurable a round at a time: what `bench/all.py` alternates.

Each stage bench exposes `pairs(quick=False)`, a context manager that prepares its data (and
warms up) once and yields `Pair`s; a pair's `lait_round` and `peer_round` each run one timed
round and return a rate in the pair's unit (higher is faster). The bench's own `main()` calls
the same round functions, so a figure means the same thing alone and in `bench/all.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Pair:
    """A lait figure and its peer's, with the target their ratio should meet."""

    name: str                          # the NAME of `ratio NAME X`
    stage: str                         # what lait runs, in a few words
    peer: str                          # what the peer runs
    unit: str                          # of both rates: "MB/s", "img/s", ...
    target: float
    lait_round: Callable[[], float]
    peer_round: Callable[[], float]
    time_ratio: bool = False           # ratio as lait's time over the peer's; the target is a ceiling

    def ratio(self, lait_rate: float, peer_rate: float) -> float:
        return peer_rate / lait_rate if self.time_ratio else lait_rate / peer_rate

    def meets(self, ratio: float) -> bool:
        return ratio <= self.target if self.time_ratio else ratio >= self.target

    @property
    def target_text(self) -> str:
        return f"<= {self.target:.2f}x" if self.time_ratio else f">= {self.target:.2f}"
