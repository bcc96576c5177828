"""What the caption judge reads of the labelled rows, as stage 3 itself computes it.

`collect` runs this checkout's stage 3 in this process over the real-web mode's pages (the
shared pages, or another directory of pages), partition by partition as `run_clean.py` lays
them out, with the judge's sink set (`CleanStage.judge_sink`): the rules run as configured,
the judge is not asked, and every page text the rules keep comes back with its
`lait.filters.caption_judge.JudgeInput`. Used by `train_judge.py` (training rows) and
`bench_captions.py` (leave-site-out evaluation), so both read the texts as stage 3 does.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
N_PARTITIONS = 4  # as run_clean.py: the site counts the judge reads are per partition


def collect(data: Path, pages_dir: Path | None = None, languages: tuple[str, ...] = ("en",)) -> dict:
    """{(page path, image path, text): {"source", "input": JudgeInput, "asked": whether the judge
    reads it}} for every page text stage 3 keeps (rules only) over the real-web pages of `data` (or of `pages_dir`)."""
    from run_clean import BASE, write_pages  # this folder, on sys.path as for the importers

    from lait.filters.text_stage import CleanConfig, CleanStage
    from lait.stage import run_part
    from lait.testkit.realweb import RealWebSite
    from lait.workdir import WorkDir

    logging.getLogger("trafilatura").setLevel(logging.ERROR)
    site = RealWebSite(data, pages_dir=pages_dir)
    paths = [p for p in site.page_paths() if p != "/"]
    tmp = Path(tempfile.mkdtemp(prefix="judge-data-"))
    try:
        work = WorkDir(tmp / "work", n_partitions=N_PARTITIONS).init()
        parts = write_pages(work, site, paths)
        stage = CleanStage(CleanConfig(work=str(work.root), progress=False, languages=list(languages),
                                       caption_judge="none"))
        stage.judge_sink = []
        for p in parts:  # the pages parsed once (`ExtractStage`), as every executor runs it first
            for pre in stage.before():
                run_part(pre, str(work.root), p)
        stage.global_steps(work)  # the count of each site's texts that every partition reads
        for p in parts:
            run_part(stage, str(work.root), p)
        return {(page[len(BASE):], image[len(BASE):], x.text): {"source": x.source, "input": x, "asked": asked}
                for page, image, x, asked in stage.judge_sink}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def labelled(split: str = "all") -> list[dict]:
    """Rows of labelled.json (shared pages) of a split (tune, heldout or all)."""
    rows = json.loads((HERE / "labelled.json").read_text(encoding="utf-8"))["rows"]
    return [r for r in rows if split == "all" or r["split"] == split]


def unseen() -> list[dict]:
    """Rows of unseen.json (trafilatura's evaluation pages)."""
    return json.loads((HERE / "unseen.json").read_text(encoding="utf-8"))["rows"]


def site_of_row(row: dict) -> str:
    """The site a labelled row's page belongs to: unseen rows name it; a shared page is its own."""
    return row.get("site") or row["page"]


def rows_with_inputs(rows: list[dict], found: dict) -> tuple[list[dict], int]:
    """The labelled rows that stage 3 keeps, each with its JudgeInput; and how many it does not."""
    out = []
    for r in rows:
        hit = found.get((r["page"], r["image"], r["text"]))
        if hit is not None:
            out.append({**r, "input": hit["input"], "asked": hit["asked"]})
    return out, len(rows) - len(out)
