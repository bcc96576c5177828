"""The page's declared language as a prior for short texts (issue 33): what it saves and costs.

- saved: human English captions (the COCO and Flickr8k captions of ../shared/data, 15,400) that
  the model alone tags another language, and how many of them are still not `en` when their page
  declares English (`lait.filters.langid.detect(text, "en")`);
- cost: the texts of `langid_written.json` in 26 other languages, read as if a page declaring
  English carried them (a page whose declaration is wrong for them): how many become `en`.

Printed for the shipped rule (`PRIOR_RATIO`, letters checked) and for other ratios, so the
choice can be seen. Only texts of at most `PRIOR_MAX_WORDS` words take the prior.

    .venv/bin/python bench/captions/bench_langid_prior.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    from lait.filters import langid

    data = REPO.parent / "shared" / "data" / "photos"
    if not data.is_dir():
        sys.exit("../shared/data is absent")
    captions = [a["caption"].strip() for name in ("flickr8k", "coco_train")
                for a in json.loads((data / name / "captions.json").read_text())["annotations"]]
    written = {k: v for k, v in json.loads((HERE / "langid_written.json").read_text(encoding="utf-8")).items()
               if not k.startswith("_")}
    others = [t for lang, texts in written.items() if lang != "en" for t in texts]
    alone = sum(langid.detect(t)[0] != "en" for t in captions)
    foreign_alone = sum(langid.detect(t)[0] == "en" for t in others)
    print(f"human English captions: {len(captions)}; texts in other languages: {len(others)}")
    print(f"model alone: captions not tagged en {alone}; other-language texts tagged en {foreign_alone}")
    print(f"{'ratio':>6s} {'letters checked':>16s} {'captions not en':>16s} {'others made en':>15s}")
    shipped = langid.PRIOR_RATIO
    fit = langid._letters_fit
    try:
        for ratio in (0.0, 0.05, 0.1, 0.25, 0.5):
            for checked in (True, False):
                langid.PRIOR_RATIO = ratio
                langid._letters_fit = fit if checked else (lambda text, lang: True)
                lost = sum(langid.detect(t, "en")[0] != "en" for t in captions)
                made = sum(langid.detect(t, "en")[0] == "en" for t in others)
                mark = "  <- shipped" if ratio == shipped and checked else ""
                print(f"{ratio:>6.2f} {str(checked):>16s} {lost:>16d} {made:>15d}{mark}")
    finally:
        langid.PRIOR_RATIO, langid._letters_fit = shipped, fit


if __name__ == "__main__":
    main()
