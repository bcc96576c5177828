"""The learned caption judge of stage 3: is a text that the rules kept junk no caption could use?

A logistic regression over the text's sentence embedding and a few facts stage 3 knows about
the text: where it was found (its source), where its image sits on the page, its length, on how
many pages of the same site it appears, and whether its language is the page's. The embedding
is MiniLM's, distilled to static token vectors (`lait.models`, `minilm-static`: the mean of the
text's WordPiece tokens' vectors, each token's MiniLM sentence embedding reduced by PCA), so that
the judge costs stage 3 a few per cent of its time instead of more than doubling it. It was
trained on hand-labelled candidate texts (`bench/captions`: the tune half of `labelled.json`
and `unseen.json`, label `junk` against `describes` and `page`) by
`bench/captions/train_judge.py`, which writes the weights this module loads
(`caption_judge.npz`: plain arrays, no pickle) with the threshold it chose on the training rows
(`choose_threshold`).

The judge only sees texts that every rule kept: a rule that is sure stays a rule. It does not
judge `<figcaption>` texts (nor URL-list captions): a page's own caption element is the surest
source there is, and on the shared readability pages the judge dropped human figcaptions.
A text whose probability of junk reaches the threshold is dropped as `clean/not_caption`, with
the probability in the detail. Embeddings are computed once per distinct text of a partition.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

WEIGHTS = Path(__file__).resolve().parent / "caption_judge.npz"
SOURCES = ("alt", "title", "aria", "figcaption", "og", "context", "list")
JUDGED_SOURCES = frozenset({"alt", "title", "aria", "og", "context"})  # texts of other sources are kept
ENCODER = "minilm-static"  # lait.models: MiniLM distilled to static token vectors
TARGET_JUNK = 0.04  # choose_threshold: the junk share the threshold aims at on the training rows

EXTRA = ("log_words", "log_chars", "position", "site_pages_with_text", "site_share",
         "lang_en", "lang_is_page_lang", "page_lang_declared", "digit_share", "upper_share",
         "ends_cut", "has_sentence_end")
FEATURES = tuple(f"source_{s}" for s in SOURCES) + EXTRA
_CUT = re.compile(r"(\.\.\.|…)\s*$")
_SENTENCE_END = re.compile(r"[.!?。]\s*$")


@dataclass(frozen=True)
class JudgeInput:
    """What the judge reads of one candidate text, as stage 3 knows it.

    `position`: the image's rank among the page's images, from 0 (first) to 1 (last);
    `site_count`: pages of the site (in the partition) that give this text, `site_pages`: the
    site's pages there; `lang`: the text's language as language ID read it; `page_lang`: the
    page's `<html lang>`, None when undeclared."""

    text: str
    source: str
    position: float
    site_count: int
    site_pages: int
    lang: str | None
    page_lang: str | None


def judged(x: JudgeInput) -> bool:
    """Whether the judge reads this text (else stage 3 keeps it as the rules left it)."""
    return x.source in JUDGED_SOURCES


def simple_features(x: JudgeInput) -> list[float]:
    """The facts of one text beside its embedding, in the order of `FEATURES`."""
    words = len(x.text.split())
    chars = max(1, len(x.text))
    page_lang = (x.page_lang or "").split("-")[0].strip().lower() or None
    # Counted with map over str methods: stage 3 reads thousands of texts a partition.
    letters = sum(map(str.isalpha, x.text))
    return [*(float(x.source == s) for s in SOURCES),
            math.log1p(words), math.log1p(chars) / 3, x.position,
            math.log1p(max(0, x.site_count - 1)), x.site_count / max(1, x.site_pages),
            float(x.lang == "en"), float(page_lang is not None and x.lang == page_lang),
            float(page_lang is not None),
            sum(map(str.isdigit, x.text)) / chars,
            sum(map(str.isupper, x.text)) / max(1, letters),
            float(bool(_CUT.search(x.text))), float(bool(_SENTENCE_END.search(x.text)))]


def feature_matrix(inputs: list[JudgeInput], encoder: Any) -> np.ndarray:
    """(n, encoder.dim + len(FEATURES)) float32: each text's embedding, then its simple
    features. The embeddings of distinct texts are computed once, in batches."""
    if not inputs:
        return np.zeros((0, encoder.dim + len(FEATURES)), np.float32)
    # By length, so that a batch of a transformer encoder pads its texts to about their own length.
    distinct = sorted({x.text for x in inputs}, key=lambda t: (len(t), t))
    row_of = {t: i for i, t in enumerate(distinct)}
    emb = encoder.encode(distinct, batch_size=128)
    simple = np.asarray([simple_features(x) for x in inputs], np.float32)
    return np.concatenate([emb[[row_of[x.text] for x in inputs]], simple], axis=1)


class CaptionJudge:
    """The trained judge: `p_junk(inputs)`; `weights` is an npz with `w`, `b`, `mean`, `std`,
    `features` (the names of the columns beside the embedding), `encoder` (a sentence encoder
    of `lait.models`) and `threshold` (the probability of junk from which a text is dropped)."""

    def __init__(self, w: np.ndarray, b: float, mean: np.ndarray, std: np.ndarray, encoder_name: str,
                 encoder: Any = None, threshold: float = 0.5):
        self.w, self.b, self.mean, self.std = w, float(b), mean, std
        self.encoder_name = encoder_name
        self.threshold = float(threshold)
        self._encoder = encoder

    @classmethod
    def load(cls, path: str | Path = WEIGHTS, encoder: Any = None) -> CaptionJudge:
        """The judge saved at `path`; FileNotFoundError when it is missing, ValueError when it
        was trained on other features than this code computes (never a silent default)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"caption judge weights missing: {path} "
                                    "(bench/captions/train_judge.py writes them)")
        with np.load(path, allow_pickle=False) as z:
            names = tuple(str(s) for s in z["features"])
            if names != FEATURES:
                raise ValueError(f"{path} was trained on features {names}, this code computes {FEATURES}")
            if "threshold" not in z.files:
                raise ValueError(f"{path} has no threshold (weights of a judge before version 6; retrain it)")
            return cls(z["w"], float(z["b"]), z["mean"], z["std"], str(z["encoder"]), encoder,
                       float(z["threshold"]))

    def save(self, path: str | Path, **meta: Any) -> None:
        np.savez(path, w=self.w.astype(np.float32), b=np.float32(self.b), mean=self.mean.astype(np.float32),
                 std=self.std.astype(np.float32), features=np.asarray(FEATURES), encoder=np.asarray(self.encoder_name),
                 threshold=np.float32(self.threshold), **{k: np.asarray(v) for k, v in meta.items()})

    @property
    def encoder(self) -> Any:
        if self._encoder is None:
            from lait.models import load_sentence_encoder

            self._encoder = load_sentence_encoder(self.encoder_name)
        return self._encoder

    def p_junk_of_matrix(self, x: np.ndarray) -> np.ndarray:
        z = ((x - self.mean) / self.std) @ self.w + self.b
        return 1.0 / (1.0 + np.exp(-z))

    def p_junk(self, inputs: list[JudgeInput]) -> np.ndarray:
        """The probability that each text is junk, in order."""
        if not inputs:
            return np.zeros(0)
        return self.p_junk_of_matrix(feature_matrix(inputs, self.encoder))


def kept_junk_share(junk: np.ndarray, dropped: np.ndarray) -> float:
    """The share of junk among the rows not dropped (0 when none is kept)."""
    kept = ~dropped
    return float(junk[kept].sum() / kept.sum()) if kept.any() else 0.0


def choose_threshold(p: np.ndarray, junk: np.ndarray, asked: np.ndarray, target: float = TARGET_JUNK,
                     grid: np.ndarray | None = None) -> float:
    """The highest threshold (the one that drops the fewest rows) at which the junk share among
    the kept rows is at most `target`, given each row's probability `p` (out-of-fold: from a
    judge that did not train on it), whether it is junk, and whether the judge reads it (rows it
    does not read are always kept). The lowest threshold of the grid when none reaches it."""
    grid = np.round(np.arange(0.05, 0.951, 0.025), 3) if grid is None else grid
    p, junk, asked = np.asarray(p, float), np.asarray(junk, bool), np.asarray(asked, bool)
    best = float(grid[0])
    for th in grid:
        if kept_junk_share(junk, asked & (p >= th)) <= target:
            best = float(th)
    return best


def fit(x: np.ndarray, y: np.ndarray, l2: float = 1.0, steps: int = 2000, lr: float = 0.5,
        encoder_name: str = ENCODER) -> CaptionJudge:
    """Logistic regression (y = 1 for junk) by full-batch gradient descent on standardised
    columns, with an L2 penalty `l2` (per row of data) and classes weighted to balance.
    Deterministic: the same rows give the same weights."""
    x = x.astype(np.float64)
    y = y.astype(np.float64)
    mean = x.mean(0)
    std = x.std(0) + 1e-6
    xs = (x - mean) / std
    pos = max(1.0, y.sum())
    neg = max(1.0, len(y) - y.sum())
    weight = np.where(y == 1, len(y) / (2 * pos), len(y) / (2 * neg))
    w = np.zeros(x.shape[1])
    b = 0.0
    n = len(y)
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(xs @ w + b)))
        g = weight * (p - y)
        w -= lr * (xs.T @ g / n + l2 * w / n)
        b -= lr * g.mean()
    return CaptionJudge(w, b, mean, std, encoder_name)
