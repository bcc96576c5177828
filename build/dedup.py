"""Duplicate grouping for stage 5: exact content (sha256), perceptual hash within a Hamming
radius, and near-duplicate pairs found from embeddings in stage 4, across the whole dataset;
the last two only propose pairs that a pixel check confirms (`lait.build.pixels`).

Grouping is a union-find over image indices; it does not depend on input order, because the
representative of a group is chosen afterwards by a total order (see `lait.build.aggregate`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Protocol


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


MAX_CLUSTERS = 64


class SamePicture(Protocol):
    """The evidence that confirms a proposed pair (`lait.build.pixels.PixelCheck`)."""

    def load(self, indices: Iterable[int]) -> None: ...

    def same(self, a: int, b: int) -> bool: ...


def group_duplicates(sha256: Sequence[str], phash: Sequence[int], phash_threshold: int,
                     extra_pairs: Iterable[tuple[int, int]] = (), check: SamePicture | None = None) -> list[list[int]]:
    """Groups of indices that show the same picture; every index is in exactly one group.

    Equal sha256 join directly. Perceptual hashes within `phash_threshold` bits and
    `extra_pairs` only propose pairs; with a `check`, a proposed pair joins only when the check
    confirms it (a perceptual hash alone collides on simple pictures). The check sees one index
    per distinct sha256.
    """
    uf = UnionFind(len(sha256))
    first: dict[str, int] = {}
    for i, h in enumerate(sha256):
        uf.union(first.setdefault(h, i), i)
    content = sorted(set(first.values()))  # one index per distinct content
    rep = [first[h] for h in sha256]
    by_hash: dict[int, list[int]] = defaultdict(list)
    for i in content:
        by_hash[phash[i]].append(i)
    near: list[tuple[int, int]] = []  # pairs of distinct phash values within the threshold
    if phash_threshold >= 0:
        distinct = list(by_hash)
        near = [(distinct[a], distinct[b]) for a, b in phash_pairs(distinct, phash_threshold)]
    extra = sorted({(min(rep[a], rep[b]), max(rep[a], rep[b])) for a, b in extra_pairs if rep[a] != rep[b]})
    if check is None:
        if phash_threshold >= 0:
            for members in by_hash.values():
                for i in members[1:]:
                    uf.union(members[0], i)
            for ha, hb in near:
                uf.union(by_hash[ha][0], by_hash[hb][0])
        for a, b in extra:
            uf.union(a, b)
        return uf.groups()

    proposed = {i for a, b in extra for i in (a, b)}
    if phash_threshold >= 0:
        proposed |= {i for members in by_hash.values() if len(members) > 1 for i in members}
        proposed |= {i for pair in near for h in pair for i in by_hash[h]}
    check.load(sorted(proposed))
    # Within a bucket of equal hashes, each image joins the first cluster it matches: a thousand
    # copies of one blank image are a thousand checks, not half a million. Only the first
    # MAX_CLUSTERS distinct pictures of one hash are searched, so the checks stay linear.
    clusters: dict[int, list[int]] = {}
    for h, members in by_hash.items() if phash_threshold >= 0 else ():
        reps: list[int] = []
        for i in members:
            match = next((c for c in reps[:MAX_CLUSTERS] if check.same(c, i)), None)
            if match is None:
                reps.append(i)
            else:
                uf.union(match, i)
        clusters[h] = reps
    for ha, hb in near:
        for a in clusters[ha][:MAX_CLUSTERS]:
            for b in clusters[hb][:MAX_CLUSTERS]:
                if uf.find(a) != uf.find(b) and check.same(a, b):
                    uf.union(a, b)
    for a, b in extra:
        if uf.find(a) != uf.find(b) and check.same(a, b):
            uf.union(a, b)
    return uf.groups()
