"""MetaCLIP's curation (Xu et al., 2023, "Demystifying CLIP Data"): substring matching of
captions against a list of metadata entries, then balancing that caps every entry at `t` pairs.

Matching follows MetaCLIP's rule: an entry matches a caption when ` entry ` is a substring of
the caption with spaces around its punctuation (, . ; : ? ! `) and at both ends. On
whitespace-separated tokens that is "the entry's tokens occur contiguously in the caption's",
which is what `match` looks up, n-gram by n-gram, instead of scanning every entry per caption.

Balancing: MetaCLIP keeps a pair with probability 1 - prod_e(1 - min(1, t / count_e)) over the
entries e it matches, count_e counted over the whole pool. Here each entry picks a uniformly
random min(count_e, t) of its pairs (ranked by a seeded hash of uid and entry) and a pair is kept
when any of its entries picked it. The entries' picks use disjoint hashes, so they are
independent and a pair's chance is exactly the formula above; and, unlike a coin per pair, no
entry ever picks more than t, and one under t picks all of its pairs. A pair that matches no
entry is dropped, as MetaCLIP drops it. Deterministic for a seed, whatever the workers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

PUNCT = re.compile(r"([,.;:?!`])")


def tokens(text: str, case_sensitive: bool = False) -> tuple[str, ...]:
    """MetaCLIP's spacing of a text, as tokens."""
    text = PUNCT.sub(r" \1 ", text if case_sensitive else text.lower())
    return tuple(text.split())


def read_metadata(text: str) -> list[str]:
    """Entries of a metadata file: one a line, or a JSON list of strings (MetaCLIP's
    metadata.json); `#` starts a comment line in the text form."""
    import json

    stripped = text.lstrip()
    if stripped.startswith("["):
        entries = json.loads(stripped)
        if not all(isinstance(e, str) for e in entries):
            raise ValueError("a JSON metadata file is a list of strings")
        return entries
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass
class Matcher:
    """The entries as token tuples, with what a caption's n-gram lookup needs."""

    entries: list[str]
    case_sensitive: bool = False

    def __post_init__(self) -> None:
        self.index: dict[tuple[str, ...], list[int]] = {}
        # The n-gram lengths worth trying from a token: those of the entries that start with it.
        self.lengths: dict[str, set[int]] = {}
        for i, entry in enumerate(self.entries):
            toks = tokens(entry, self.case_sensitive)
            if not toks:
                continue
            self.index.setdefault(toks, []).append(i)
            self.lengths.setdefault(toks[0], set()).add(len(toks))
        self.lengths_sorted = {k: sorted(v) for k, v in self.lengths.items()}

    def match(self, caption: str) -> list[int]:
        """The ids of the entries `caption` matches, each once, ascending."""
        toks = tokens(caption, self.case_sensitive)
        found: set[int] = set()
        for i, tok in enumerate(toks):
            for n in self.lengths_sorted.get(tok, ()):
                ids = self.index.get(toks[i:i + n])
                if ids is not None:
                    found.update(ids)
        return sorted(found)


def match_all(matcher: Matcher, captions: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every (pair, entry) match of `captions` as two int64 arrays, pairs ascending."""
    pairs: list[int] = []
    entries: list[int] = []
    for p, caption in enumerate(captions):
        ids = matcher.match(caption)
        pairs.extend([p] * len(ids))
        entries.extend(ids)
    return np.asarray(pairs, np.int64), np.asarray(entries, np.int64)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: uint64 in, well-mixed uint64 out (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def uid_keys(uids: Sequence[str]) -> np.ndarray:
    """A uint64 per uid (its first 16 hex digits: uids are already hashes)."""
    return np.fromiter((int(u[:16], 16) for u in uids), np.uint64, len(uids))


@dataclass
class Balance:
    keep: np.ndarray          # bool per pair
    matched: np.ndarray       # bool per pair: matched at least one entry
    counts: np.ndarray        # int64 per entry: pairs matching it in the pool
    picked: np.ndarray        # int64 per entry: pairs it picked (min(count, t))


def balance(n_pairs: int, keys: np.ndarray, pair_ids: np.ndarray, entry_ids: np.ndarray, n_entries: int,
            t: int, seed: int = 0) -> Balance:
    """MetaCLIP's balancing of `n_pairs` pairs given their (pair, entry) matches; `keys` is a
    uint64 per pair (`uid_keys`) that makes the draw depend on the pair, not its position."""
    counts = np.bincount(entry_ids, minlength=n_entries).astype(np.int64)
    matched = np.zeros(n_pairs, bool)
    matched[pair_ids] = True
    keep = np.zeros(n_pairs, bool)
    if len(pair_ids):
        salt = mix64(entry_ids.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) % 2**64))
        h = mix64(keys[pair_ids] ^ salt)
        order = np.lexsort((h, entry_ids))  # by entry, then by the random draw
        sorted_entries = entry_ids[order]
        first = np.searchsorted(sorted_entries, sorted_entries, side="left")
        rank = np.arange(len(order)) - first
        picked_rows = order[rank < t]
        keep[pair_ids[picked_rows]] = True
    return Balance(keep, matched, counts, np.minimum(counts, t))


def keep_probability(counts_of_entries: Iterable[int], t: int) -> float:
    """MetaCLIP's chance that a pair matching entries of these pool counts is kept."""
    miss = 1.0
    for c in counts_of_entries:
        miss *= 1.0 - min(1.0, t / c)
    return 1.0 - miss
