"""Pages per second of stage 3 (`lait clean`) beside `trafilatura.extract` alone on the same pages.

Data: the real pages of ../shared/data/html (readability source.html + aeb *.html.gz). One
process, median of R rounds, measured in this run:

- trafilatura:  `trafilatura.extract(html_bytes)` with its defaults, page after page
- stage 3:      CleanStage over a work directory holding those pages (decode, parse, images and
                their texts, trafilatura on the same tree, sentences, rules, language ID, the
                caption judge: static MiniLM token vectors (`minilm-static`) averaged over
                each distinct kept text of the partition, and its logistic regression,
                Parquet in and out), one worker, the language-ID model and the judge already
                loaded (their one-time load per worker process is printed separately)
- stage 3 with its defaults (`caption_judge place`: where each image sits, issue 62, and no
  learned judge)
- stage 3 with neither (`caption_judge none`), for what the place judgement costs

Targets: stage 3 with its defaults at most 1.3x the time of trafilatura alone (issue 62;
1.2x before the place judgement, issue 23), with the learned judge at most 1.3x (issue 33).
`pairs()` yields stage 3 with its defaults and with the judge, each beside trafilatura, for
`bench/all.py`.

    .venv/bin/python bench/clean/bench_clean.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import logging
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "filters"))
sys.path.insert(0, str(REPO / "bench"))

from pairs import Pair  # noqa: E402

TARGET = 1.3  # stage 3's time (caption judge on) / trafilatura's (issue 33)
DEFAULT_TARGET = 1.3  # stage 3 with its defaults (issue 62; 1.2 before the place judgement, issue 23)


def load_pages() -> list[tuple[str, bytes]]:
    root = REPO.parent / "shared" / "data" / "html"
    if not root.is_dir():
        sys.exit("../shared/data/html is absent")
    pages = [(f"http://readability.test/{p.parent.name}/", p.read_bytes())
             for p in sorted(root.glob("readability/*/source.html"))]
    pages += [(f"http://aeb.test/{p.name[:-8]}", gzip.decompress(p.read_bytes()))
              for p in sorted(root.glob("aeb/html/*.html.gz"))]
    return pages


def load_langid() -> float:
    """Seconds the language-ID model takes to load, once per process; not part of either rate."""
    from lait.filters.text_rules import Candidate, LanguageFilter

    start = time.perf_counter()
    LanguageFilter(["en"]).keep(Candidate("A warm-up sentence in English.", "alt", "u", "p"))
    return time.perf_counter() - start


def load_judge() -> float:
    """Seconds the caption judge (its token table and weights) takes to load, once per process."""
    from lait.filters.caption_judge import CaptionJudge, JudgeInput

    start = time.perf_counter()
    CaptionJudge.load().p_junk([JudgeInput("A warm-up sentence in English.", "alt", 0.0, 1, 1, "en", "en")])
    return time.perf_counter() - start


class CleanBench:
    """The pages as a `pages/` table; each stage round runs on a fresh copy of it."""

    def __init__(self, tmp: Path, pages: list[tuple[str, bytes]]):
        import conftest as td  # tests/filters helpers: rows and table writing

        from lait.workdir import WorkDir

        logging.getLogger("trafilatura").setLevel(logging.ERROR)
        self.tmp, self.pages = tmp, pages
        self.src = WorkDir(tmp / "src", n_partitions=4).init()
        td.write_table(self.src, "pages", [td.page_row(u, b) for u, b in pages], "url")
        self.candidates: list[int] = []

    def trafilatura_rate(self) -> float:
        import trafilatura

        t0 = time.perf_counter()
        for _, body in self.pages:
            trafilatura.extract(body)
        return len(self.pages) / (time.perf_counter() - t0)

    def stage_rate(self, judge: str = "default") -> float:
        from lait.executor import LocalExecutor
        from lait.filters.config import CleanConfig
        from lait.filters.text_stage import CleanStage
        from lait.workdir import WorkDir

        root = self.tmp / "work"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(self.src.root, root)
        cfg = CleanConfig(work=str(root), progress=False, caption_judge=judge)
        t0 = time.perf_counter()
        report = LocalExecutor(workers=1, show_progress=False).run(CleanStage(cfg), WorkDir(root))
        rate = len(self.pages) / (time.perf_counter() - t0)
        assert report.ok, report.summary()
        self.candidates.append(WorkDir(root).count("candidates"))
        return rate


@contextmanager
def pairs(quick: bool = False):
    """Stage 3 beside trafilatura alone on the same pages (every 15th page when quick)."""
    pages = load_pages()
    if quick:
        pages = pages[::15]
    load_langid()
    load_judge()
    tmp = Path(tempfile.mkdtemp(prefix="bench-clean-"))
    try:
        b = CleanBench(tmp, pages)
        yield [Pair("clean", f"lait clean (stage 3, default settings: the place judgement, no learned judge), 1 worker, "
                    f"{len(pages)} real pages",
                    "trafilatura.extract, defaults", "pages/s", DEFAULT_TARGET, lambda: b.stage_rate("place"),
                    b.trafilatura_rate, time_ratio=True),
               Pair("clean_judge", f"lait clean with the caption judge, 1 worker, {len(pages)} real pages",
                    "trafilatura.extract, defaults", "pages/s", TARGET, b.stage_rate, b.trafilatura_rate,
                    time_ratio=True)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    pages = load_pages()
    print(f"{len(pages)} pages, {sum(len(b) for _, b in pages) / len(pages) / 1e3:.0f} KB on average, 1 process")
    print(f"language-ID model load (once per worker process): {load_langid():.1f} s")
    print(f"caption judge load, static MiniLM table (once per worker process): {load_judge():.1f} s")

    tmp = Path(tempfile.mkdtemp(prefix="bench-clean-"))
    try:
        b = CleanBench(tmp, pages)
        figures: dict[str, list[float]] = {"trafilatura.extract": [], "stage 3": [], "stage 3, defaults": [],
                                           "stage 3, neither": []}
        for _ in range(args.rounds):
            figures["trafilatura.extract"].append(b.trafilatura_rate())
            figures["stage 3"].append(b.stage_rate())
            figures["stage 3, defaults"].append(b.stage_rate("place"))
            figures["stage 3, neither"].append(b.stage_rate("none"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"stage 3 wrote {b.candidates[-3]} (page, image) candidate rows with the learned judge, {b.candidates[-2]} "
          f"with its defaults, {b.candidates[-1]} with neither")
    med = {k: statistics.median(v) for k, v in figures.items()}
    for k, v in med.items():
        print(f"{k:20s} {v:7.1f} pages/s   (rounds: {', '.join(f'{x:.1f}' for x in figures[k])})")
    print(f"time ratio stage 3 / trafilatura alone = {med['trafilatura.extract'] / med['stage 3']:.2f}   "
          f"(target <= {TARGET:.2f}, caption judge on)")
    print(f"time ratio stage 3 with its defaults (place) / trafilatura alone = "
          f"{med['trafilatura.extract'] / med['stage 3, defaults']:.2f}   (target <= {DEFAULT_TARGET:.2f})")
    print(f"time ratio stage 3 with neither / trafilatura alone = "
          f"{med['trafilatura.extract'] / med['stage 3, neither']:.2f}")


if __name__ == "__main__":
    main()
