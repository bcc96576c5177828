"""Curation recipes for `lait select`: named, composable lists of selection steps.

A recipe is a YAML file (the shipped ones are in `build/recipes/`; copy one and change it):

    description: one line saying what it selects and where the rule comes from
    steps:
      - {rule: language, languages: [en]}
      - {rule: caption_words, more_than: 2}
      - {recipe: clip-top30}          # every step of another recipe: an intersection

Steps run in order, each on what the steps before it kept, except `top_fraction`, which ranks
the whole pool as DataComp's baselines do (its `of: kept` ranks the survivors instead). Every
pool sample a step removes is recorded with the step's registered reason (`select/RULE`, in
lait/reasons.py) and a detail, and each step's in/removed counts go into the selection's stats.
Paths inside a recipe (`metadata`, `names`, `targets`) are relative to the recipe's own file.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lait import storage
from lait.config import ConfigError

RECIPE_DIR = Path(__file__).with_name("recipes")
# The pool columns the rules read (semdedup reads image_embs/ besides).
POOL_COLUMNS = ["uid", "image_url", "page_url", "caption", "lang", "score", "width", "height"]


def builtin_recipes() -> dict[str, str]:
    """Name -> description of every shipped recipe."""
    import yaml

    out = {}
    for p in sorted(RECIPE_DIR.glob("*.yaml")):
        out[p.stem] = (yaml.safe_load(p.read_text()) or {}).get("description", "")
    return out


@dataclass
class Step:
    rule: str
    params: dict[str, Any]
    recipe: str  # the recipe it came from, for the stats
    base: Path   # the folder its relative paths are relative to
    stats: dict[str, Any] = field(default_factory=dict)  # what the rule reports of its run

    def path(self, key: str) -> str:
        value = str(self.params[key])
        return value if storage.is_remote_url(value) or Path(value).is_absolute() else str(self.base / value)

    def content(self) -> dict[str, Any]:
        """What the selection depends on: the rule, its settings and the files it reads."""
        out = {"rule": self.rule, "recipe": self.recipe, **self.params}
        for key in ("metadata", "names", "targets"):
            if self.params.get(key):
                try:
                    raw = storage.read_bytes(storage.location(self.path(key)))
                except FileNotFoundError:
                    raise ConfigError(f"recipe {self.recipe}, rule {self.rule}: {key} file {self.path(key)} "
                                      f"not found") from None
                out[key + "_sha256"] = hashlib.sha256(raw).hexdigest()
                out.pop(key)
        return out


def recipe_file(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        p = Path(name)
        if not p.is_file():
            raise ConfigError(f"recipe file {name} not found")
        return p
    p = RECIPE_DIR / f"{name}.yaml"
    if not p.is_file():
        raise ConfigError(f"unknown recipe {name!r}; shipped: {', '.join(builtin_recipes())} (or a YAML file's path)")
    return p


def load(name: str, _seen: tuple[str, ...] = ()) -> list[Step]:
    """The steps of recipe `name` (a shipped name or a YAML path), includes expanded."""
    import yaml

    path = recipe_file(name)
    label = path.stem
    if str(path.resolve()) in _seen:
        raise ConfigError(f"recipe {label} includes itself")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"recipe {path}: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("steps"), list) or not doc["steps"]:
        raise ConfigError(f"recipe {path}: a mapping with a non-empty list `steps`")
    steps: list[Step] = []
    for raw in doc["steps"]:
        if not isinstance(raw, dict):
            raise ConfigError(f"recipe {path}: a step is a mapping, got {raw!r}")
        if "recipe" in raw:
            inner = str(raw["recipe"])
            if inner.endswith((".yaml", ".yml")) and not Path(inner).is_absolute():
                inner = str(path.parent / inner)  # a file beside the including recipe
            steps += load(inner, _seen + (str(path.resolve()),))
            continue
        params = dict(raw)
        rule = params.pop("rule", None)
        if rule not in RULES:
            raise ConfigError(f"recipe {path}: unknown rule {rule!r}; rules: {', '.join(RULES)}")
        allowed = RULES[rule].params
        unknown = set(params) - set(allowed)
        if unknown:
            raise ConfigError(f"recipe {path}: rule {rule} takes {', '.join(allowed) or 'no settings'}, "
                              f"not {', '.join(sorted(unknown))}")
        steps.append(Step(rule, {**allowed, **params}, label, path.parent))
    return steps


def load_all(names: list[str]) -> list[Step]:
    """Several recipes one after another: their intersection."""
    return [s for n in names for s in load(n)]


# -- the rules ---------------------------------------------------------------------------------
@dataclass
class Pool:
    """What a rule sees: the pool's columns, the indices still kept, and a reader of embeddings."""

    table: pa.Table
    # pool indices -> (has an embedding, per index; the embeddings of those that have one)
    embeddings: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    _columns: dict[str, np.ndarray] = field(default_factory=dict)

    def column(self, name: str) -> np.ndarray:
        if name not in self._columns:
            self._columns[name] = self.table[name].to_numpy(zero_copy_only=False)
        return self._columns[name]


# A rule: (pool, step, indices kept so far) -> {index: (reason, detail)} of what it removes.
RuleFn = Callable[[Pool, Step, np.ndarray], dict[int, tuple[str, str]]]


@dataclass
class Rule:
    fn: RuleFn
    params: dict[str, Any] = field(default_factory=dict)


def _drop(reason: str, rows: np.ndarray, detail: Callable[[int], str]) -> dict[int, tuple[str, str]]:
    """The removals of `rows` (pool indices) for `reason`, each with its detail."""
    return {int(i): (reason, detail(int(i))) for i in rows}


def language(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    langs_all = pool.column("lang")
    langs = langs_all[idx]
    wanted = set(step.params["languages"])
    bad = np.array([lang not in wanted for lang in langs], bool)
    return _drop("select/language", idx[bad], lambda i: f"caption language {langs_all[i]}")


def caption_words(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    caps = pool.column("caption")
    n = np.array([len(caps[i].split()) for i in idx], np.int64)
    bad = ~(n > step.params["more_than"])
    return _drop("select/caption_words", idx[bad], lambda i: f"{len(caps[i].split())} words")


def caption_chars(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    caps = pool.column("caption")
    n = np.array([len(caps[i]) for i in idx], np.int64)
    bad = ~(n > step.params["more_than"])
    return _drop("select/caption_chars", idx[bad], lambda i: f"{len(caps[i])} characters")


def min_side(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    w, h = pool.column("width"), pool.column("height")
    bad = ~(np.minimum(w[idx], h[idx]) >= step.params["at_least"])
    return _drop("select/min_side", idx[bad], lambda i: f"{w[i]}x{h[i]}")


def aspect(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    w, h = pool.column("width").astype(np.float64), pool.column("height").astype(np.float64)
    ratio = np.maximum(w[idx], h[idx]) / np.maximum(np.minimum(w[idx], h[idx]), 1.0)
    bad = ~(ratio <= step.params["at_most"])
    return _drop("select/aspect", idx[bad], lambda i: f"{int(w[i])}x{int(h[i])}")


def min_score(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    s = pool.column("score")
    bad = ~(s[idx] >= step.params["at_least"])
    return _drop("select/min_score", idx[bad], lambda i: f"{s[i]:.4f} < {step.params['at_least']}")


def _fraction_of(pool: Pool, step: Step, idx: np.ndarray, rule: str) -> tuple[float, np.ndarray]:
    """A fraction rule's `fraction`, checked, and the rows it is a fraction of: the whole pool
    (`of: pool`) or what earlier steps kept (`of: kept`)."""
    frac = float(step.params["fraction"])
    if not 0.0 < frac <= 1.0:
        raise ConfigError(f"{rule}: fraction must be in (0, 1], got {frac}")
    if step.params["of"] not in ("pool", "kept"):
        raise ConfigError(f"{rule}: `of` is pool or kept")
    return frac, (np.arange(pool.table.num_rows) if step.params["of"] == "pool" else idx)


def top_fraction(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    from lait.build.aggregate import score_cut

    frac, ranked = _fraction_of(pool, step, idx, "top_fraction")
    s = pool.column("score")
    urls = pool.table["image_url"].take(pa.array(ranked, pa.int64()))
    kept, _, _ = score_cut(s[ranked], urls, None, frac)
    top = set(ranked[kept].tolist())
    bad = np.array([i not in top for i in idx], bool)
    return _drop("select/top_fraction", idx[bad],
                    lambda i: f"{s[i]:.4f} not in the top {frac:g} of the {step.params['of']}")


def random_fraction(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    """A uniformly random `fraction` (rounded up) of the pool or of what earlier steps kept,
    blind to scores and captions: the control a score-based recipe is compared with. The draw
    ranks a seeded hash of each uid, so it is the same for a seed whatever the pool's order."""
    frac, ranked = _fraction_of(pool, step, idx, "random_fraction")
    uids = pool.column("uid")
    seed = int(step.params["seed"])
    keys = [hashlib.sha256(f"{seed}:{uids[i]}".encode()).digest() for i in ranked]
    order = sorted(range(len(ranked)), key=keys.__getitem__)
    drawn = {int(ranked[j]) for j in order[:math.ceil(frac * len(ranked))]}
    bad = np.array([int(i) not in drawn for i in idx], bool)
    return _drop("select/random_fraction", idx[bad],
                 lambda i: f"not drawn into the random {frac:g} of the {step.params['of']} (seed {seed})")


def text_entity(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    from lait.build.metaclip import Matcher, read_metadata

    names = read_metadata(storage.read_text(storage.location(step.path("names"))))
    matcher = Matcher(names, bool(step.params["case_sensitive"]))
    caps = pool.column("caption")
    bad = np.array([not matcher.match(caps[i]) for i in idx], bool)
    return _drop("select/no_entity", idx[bad], lambda i: "the caption names no entry of " + step.params["names"])


def metaclip(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    from lait.build.metaclip import Matcher, balance, match_all, read_metadata, uid_keys

    entries = read_metadata(storage.read_text(storage.location(step.path("metadata"))))
    t = int(step.params["t"])
    if t < 1:
        raise ConfigError("metaclip: t must be >= 1")
    matcher = Matcher(entries, bool(step.params["case_sensitive"]))
    caps = pool.column("caption")
    uids = pool.column("uid")
    pair_ids, entry_ids = match_all(matcher, (caps[i] for i in idx))
    b = balance(len(idx), uid_keys([uids[i] for i in idx]), pair_ids, entry_ids, len(entries), t,
                int(step.params["seed"]))
    step.stats = {"entries": len(entries), "entries_matched": int((b.counts > 0).sum()),
                  "entries_over_t": int((b.counts > t).sum()), "t": t}
    out = _drop("select/metaclip_unmatched", idx[~b.matched], lambda i: "the caption matches no metadata entry")
    position = {int(i): j for j, i in enumerate(idx)}
    starts = np.searchsorted(pair_ids, np.arange(len(idx)))
    ends = np.searchsorted(pair_ids, np.arange(len(idx)), side="right")

    def entries_of(i: int) -> str:
        j = position[i]
        names = entry_ids[starts[j]:ends[j]]
        return f"not drawn by its entries, t={t}: " + ", ".join(f"{entries[e]} ({b.counts[e]} pairs)" for e in names[:5])

    out.update(_drop("select/metaclip_balance", idx[b.matched & ~b.keep], entries_of))
    return out


def semdedup(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    from lait.build.semdedup import semdedup as run

    eps = float(step.params["eps"])
    if not 0.0 <= eps < 1.0:
        raise ConfigError("semdedup: eps must be in [0, 1)")
    if pool.embeddings is None:
        raise ConfigError("semdedup needs image embeddings (image_embs/, written by `lait score`)")
    have, emb = pool.embeddings(idx)
    out = _drop("select/no_embedding", idx[~have], lambda i: "no image embedding in image_embs/")
    with_emb = idx[have]
    score = pool.column("score")
    res = run(emb, eps, priority=-score[with_emb].astype(np.float64), cluster_size=int(step.params["cluster_size"]),
              seed=int(step.params["seed"]), passes=int(step.params["passes"]))
    urls = pool.column("image_url")
    position = {int(i): j for j, i in enumerate(with_emb)}

    def twin(i: int) -> str:
        j = position[i]
        return f"cosine {res.similarity[j]:.4f} to kept {urls[with_emb[res.duplicate_of[j]]]}"

    out.update(_drop("select/semdedup", with_emb[~res.keep], twin))
    step.stats = {"clusters": res.n_clusters, "eps": eps}
    return out


def image_clusters(pool: Pool, step: Step, idx: np.ndarray) -> dict:
    """DataComp's image-based filter: k-means over the pool's image embeddings, then keep the
    clusters that are nearest to at least one target embedding (ImageNet's training images,
    embedded by the pool's own scorer)."""
    from lait.build.semdedup import kmeans, normalise

    if not step.params["targets"]:
        raise ConfigError("image_clusters needs `targets:`, a .npy file of image embeddings (n x dim) of the target "
                          "images (ImageNet's, by the pool's scorer); copy the recipe and set it")
    if pool.embeddings is None:
        raise ConfigError("image_clusters needs image embeddings (image_embs/, written by `lait score`)")
    targets = np.load(step.path("targets"), allow_pickle=False)
    have, emb = pool.embeddings(idx)
    out = _drop("select/no_embedding", idx[~have], lambda i: "no image embedding in image_embs/")
    with_emb = idx[have]
    if not len(with_emb):
        return out
    if targets.ndim != 2 or targets.shape[1] != emb.shape[1]:
        raise ConfigError(f"image_clusters: targets are {targets.shape}, the pool's embeddings have dim {emb.shape[1]}")
    x = normalise(emb)
    k = int(step.params["clusters"]) or max(1, round(len(x) / 100))
    assign, centroids = kmeans(x, k, np.random.default_rng(int(step.params["seed"])), iters=20,
                               centroids_too=True)
    wanted = np.unique(np.argmax(normalise(targets) @ centroids.T, axis=1))
    far = ~np.isin(assign, wanted)
    step.stats = {"clusters": int(len(centroids)), "target_clusters": int(len(wanted))}
    pos = {int(i): j for j, i in enumerate(with_emb)}
    out.update(_drop("select/image_cluster", with_emb[far],
                     lambda i: f"cluster {assign[pos[i]]} is no target image's nearest of {len(centroids)}"))
    return out


RULES: dict[str, Rule] = {
    "language": Rule(language, {"languages": ["en"]}),
    "caption_words": Rule(caption_words, {"more_than": 2}),
    "caption_chars": Rule(caption_chars, {"more_than": 5}),
    "min_side": Rule(min_side, {"at_least": 200}),
    "aspect": Rule(aspect, {"at_most": 3.0}),
    "min_score": Rule(min_score, {"at_least": 0.28}),
    "top_fraction": Rule(top_fraction, {"fraction": 0.3, "of": "pool"}),
    "random_fraction": Rule(random_fraction, {"fraction": 0.3, "of": "pool", "seed": 0}),
    "text_entity": Rule(text_entity, {"names": "imagenet1k-classes.txt", "case_sensitive": False}),
    "metaclip": Rule(metaclip, {"metadata": "imagenet1k-classes.txt", "t": 20000, "case_sensitive": False,
                                "seed": 0}),
    "semdedup": Rule(semdedup, {"eps": 0.07, "cluster_size": 1000, "seed": 0, "passes": 1}),
    "image_clusters": Rule(image_clusters, {"targets": "", "clusters": 0, "seed": 0}),
}


@dataclass
class Curation:
    keep: np.ndarray                           # bool per pool row
    removed: dict[int, tuple[str, str]]        # pool row -> (reason, detail)
    steps: list[dict[str, Any]]                # per step: recipe, rule, reason counts, in, removed


def apply(steps: list[Step], pool: Pool) -> Curation:
    """Run `steps` over `pool`, in order."""
    keep = np.ones(pool.table.num_rows, bool)
    removed: dict[int, tuple[str, str]] = {}
    report = []
    for step in steps:
        idx = np.flatnonzero(keep)
        step.stats = {}
        gone = RULES[step.rule].fn(pool, step, idx) if len(idx) else {}
        for i, why in gone.items():
            keep[i] = False
            removed[i] = why
        reasons: dict[str, int] = {}
        for reason, _ in gone.values():
            reasons[reason] = reasons.get(reason, 0) + 1
        report.append({"recipe": step.recipe, "rule": step.rule, "settings": step.params, "in": int(len(idx)),
                       "removed": len(gone), "reasons": reasons, **step.stats})
    return Curation(keep, removed, report)


def describe_steps(report: list[dict[str, Any]]) -> list[str]:
    return [f"select: {r['recipe']}/{r['rule']}: {r['removed']} of {r['in']} removed "
            + ", ".join(f"({n} {reason})" for reason, n in r["reasons"].items()) for r in report]
