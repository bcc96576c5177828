"""Duplicate grouping for stage 5: exact content (sha256), perceptual hash within a Hamming
radius, and near-duplicate pairs found from embeddings in stage 4, across the whole dataset.

Grouping is a union-find over image indices; it does not depend on input order, because the
representative of a group is chosen afterwards by a total order (see `lait.build.aggregate`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence


class UnionFind:
    """Disjoint sets over 0..n-1 with path halving."""

    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        parent = self.parent
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # The smaller root wins so the forest (not only the groups) is order-independent.
            self.parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = defaultdict(list)
        for i in range(len(self.parent)):
            out[self.find(i)].append(i)
        return list(out.values())


def hamming(a: int, b: int) -> int:
    return (a ^ b).bit_count()


def phash_int(hex_hash: str) -> int:
    return int(hex_hash, 16)


def _bands(threshold: int, bits: int = 64) -> list[tuple[int, int]]:
    """(shift, mask) of threshold+1 bands: two hashes within `threshold` bits agree on one band."""
    n = threshold + 1
    width, extra = divmod(bits, n)
    out, shift = [], 0
    for i in range(n):
        w = width + (1 if i < extra else 0)
        out.append((shift, (1 << w) - 1))
        shift += w
    return out


def phash_pairs(hashes: Sequence[int], threshold: int) -> Iterable[tuple[int, int]]:
    """Index pairs whose hashes differ in at most `threshold` bits.

    Multi-index hashing: by pigeonhole, such a pair is equal on at least one of threshold+1
    bands, so only hashes sharing a band value are compared (not all n^2 pairs).
    """
    if threshold < 0:
        return
    seen: set[tuple[int, int]] = set()
    for shift, mask in _bands(threshold):
        buckets: dict[int, list[int]] = defaultdict(list)
        for i, h in enumerate(hashes):
            buckets[(h >> shift) & mask].append(i)
        for members in buckets.values():
            if len(members) < 2:
                continue
            for x in range(len(members)):
                a = members[x]
                for b in members[x + 1:]:
                    if (a, b) not in seen and hamming(hashes[a], hashes[b]) <= threshold:
                        seen.add((a, b))
                        yield a, b


def group_duplicates(sha256: Sequence[str], phash: Sequence[int], phash_threshold: int,
                     extra_pairs: Iterable[tuple[int, int]] = ()) -> list[list[int]]:
    """Groups of indices that show the same picture; every index is in exactly one group."""
    uf = UnionFind(len(sha256))
    first: dict[str, int] = {}
    for i, h in enumerate(sha256):
        uf.union(first.setdefault(h, i), i)
    if phash_threshold >= 0:
        # Equal hashes join directly; only distinct values go through the band search, so a
        # thousand copies of one blank image do not make a quadratic bucket.
        by_hash: dict[int, int] = {}
        for i, h in enumerate(phash):
            uf.union(by_hash.setdefault(h, i), i)
        distinct = list(by_hash)
        for a, b in phash_pairs(distinct, phash_threshold):
            uf.union(by_hash[distinct[a]], by_hash[distinct[b]])
    for a, b in extra_pairs:
        uf.union(a, b)
    return uf.groups()
