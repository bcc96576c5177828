"""`lait documents`: interleaved documents beside the pairs (issue 63), from one work directory.

The app layer runs the three passes in order on the one launcher (`lait.drivers.run_stage`):
stage 3's document pass (`lait.filters.documents`, with the settings `lait clean` last completed
with), then, as its after-steps (`lait.app.documents_stage`), stage 4's similarities
(`lait.scoring.documents`, with those of `lait score`) and stage 5's rules and writers
(`lait.build.documents`). The two table passes are stages like the others: they run on the
executor the settings name, skip partitions already done and redo those whose inputs changed.
"""

from __future__ import annotations

import argparse
import sys

from lait.app.commands import add_config_command
from lait.reasons import reasons_help

DESCRIPTION = """\
Write interleaved documents (each page's main text with its pictures where they belong) from a
work directory that `lait clean` and `lait score` have run on, without crawling or scoring again:
only the main text's sentences are encoded, and the pictures stage 4 never scored.

  1. stage 3's document pass: the page's main text (trafilatura), its paragraphs and sentences
     without the site's boilerplate, its pictures in DOM order           -> WORK/doc_pages/
  2. stage 4's similarities of every picture and sentence of a document  -> WORK/doc_sims/
  3. the document rules, each picture placed at the sentence a one-to-one assignment gives it
     (MMC4), faces blurred as in the pair shards                         -> WORK/documents/

WORK/documents/ holds NNNNN.tar (KEY.json in MMC4's shape, pictures as image_base64, as
OpenFlamingo reads MMC4), NNNNN.parquet (OBELICS's texts/images columns in DOM order) and
stats.json. Only pictures stage 2 kept are written: the consent, safety and size rules of the
pairs hold for the documents too.
"""

EPILOG = f"""\
{reasons_help(["documents"])}

examples:
  lait documents work/
  lait documents work/ --min-sim 0.2 --min-words 100
  lait documents work/ --resize-mode keep_ratio --image-size 512 --out docs/
"""


def make_documents(cfg) -> tuple[list, dict | None]:
    """Run the three passes over `cfg.work` on the one launcher (`lait.drivers.run_stage`,
    holding the directory's lock, re-entrant); returns the two table passes' reports and the
    written documents' stats (None when a pass failed)."""
    from lait.app.documents_stage import DocumentsPasses
    from lait.app.steps import recorded_settings
    from lait.drivers import run_stage
    from lait.filters.config import CleanConfig
    from lait.scoring.config import ScoreConfig

    # How the two table passes run is this command's to say (and --force redoes them too).
    run = {"work": cfg.work, "executor": cfg.executor, "workers": cfg.workers, "ray_address": cfg.ray_address,
           "force": cfg.force, "progress": cfg.progress, "retries": cfg.retries}
    clean = CleanConfig.from_dict({**recorded_settings(cfg.work, "clean", CleanConfig)[0], **run})
    score = ScoreConfig.from_dict({**recorded_settings(cfg.work, "score", ScoreConfig)[0], **run})
    passes = DocumentsPasses(clean, score, cfg)
    report = run_stage(passes, cfg, "documents")
    return [report, *passes.reports], passes.stats


def documents_line(cfg, stats: dict) -> str:
    from lait.build.documents import out_dir

    counters = stats["counters"]
    drops = ", ".join(f"{rule} {counters[f'documents/{rule}']}" for rule in
                      ("too_few_words", "repeated_paragraphs", "near_duplicate", "no_image", "too_many_images")
                      if counters.get(f"documents/{rule}"))
    return (f"documents: {stats['documents']} written to {out_dir(cfg)} ({stats['shards']} shards), "
            f"{stats['images']} pictures ({stats['images_per_document']} per document), "
            f"{stats['words_per_document']} words per document; dropped: {drops or 'none'}")


def run_documents(cfg) -> int:
    reports, stats = make_documents(cfg)
    for report in reports:
        print(report.summary(), file=sys.stderr)
    if stats is None:
        return 1
    print(documents_line(cfg, stats), file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait documents`."""
    from lait.build.config import DocumentsConfig

    add_config_command(sub, "documents", DocumentsConfig, run_documents,
                       help="interleaved documents (MMC4 tars, OBELICS Parquet) beside the pairs",
                       description=DESCRIPTION, epilog=EPILOG, continues=True)
