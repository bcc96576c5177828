"""`lait demo`: the whole LAIT job offline, on the built-in local web.

1. Generate the synthetic site (`lait.testkit`) and serve it on a loopback port.
2. Crawl it with the stage-1 spider (`lait.crawler.run.crawl`, loopback explicitly allowed).
3. Run stages 2 to 5 (`lait.build.runner`), scoring with the offline demo scorer (`scoring`).
4. Write the HTML report and print where the shards and the report are.

Everything lands in `OUT/`: `work/` (tables, `work/shards/`), `report.html`, and
`ground_truth.json` (what a correct pipeline keeps, to compare against), and with --eval-pages a held-out evaluation set in eval/ (photos of
a site generated with another seed, for `lait compare`). A second run reuses
whatever is finished: the crawl (marker `work/_done/demo_crawl.json`), every stage's finished
partitions, the shards; the demo scorer is built once per machine and cached.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lait.config import Config, ConfigError, setting
from lait.writers import atomic_write_json

log = logging.getLogger(__name__)

# What `lait demo --help` says: the user's view (the module docstring above is the developer's).
DESCRIPTION = """The whole LAIT job offline, on a built-in local web (a synthetic site of articles
with photos, captions and the usual traps: duplicates, logos, 404s, robots.txt, noai pages):

1. generate the site and serve it on a loopback port, only for the demo's duration;
2. crawl it, as `lait crawl` crawls the web;
3. run stages 2 to 5 (filter, clean, score, build), scoring with a small offline model trained
   on the site's kind of pictures (built once per machine and cached);
4. write the HTML report and print where the shards and the report are.

Everything lands in OUT/: work/ (the tables and work/shards/), report.html (with stored copies
of the pages it links to in report_pages/), and ground_truth.json (what a correct pipeline
keeps, to compare against). A second run reuses whatever is finished: the crawl, every stage's
finished partitions, the shards.

--raw-pool builds instead a pool to judge curation recipes on (lait compare): stage 3 keeps the
alt and context texts with none of its rules, stage 5 drops no text as generic, so junk alts and
page sentences become captions, as in an unfiltered web pool; demo.json records what it turned
off, and the ground-truth line counts the wrong pairs."""

CRAWL_MARKER = "_done/demo_crawl.json"
DEMO_PORT = 8765


@dataclass
class DemoConfig(Config):
    """Settings of `lait demo`."""

    section = "demo"

    out: str = setting("demo", "folder for the work directory, the shards and the report")
    pages: int = setting(120, "articles of the synthetic site")
    seed: int = setting(0, "seed of the synthetic site")
    workers: int = setting(0, "worker processes per stage (0: one per CPU core)")
    port: int = setting(DEMO_PORT, "loopback port of the local web (a free one if taken; a resumed crawl "
                        "needs the same port, so the first run's port is remembered)")
    languages: list[str] = setting(["en", "de", "fr"], "caption languages kept (the local web has these three)")
    min_score: float | None = setting(None, "build: drop images whose best text scores below this")
    samples_per_shard: int = setting(100, "build: samples per shard (small, so the demo shows several)")
    progress: bool = setting(True, "show progress bars on a terminal")
    raw_pool: bool = setting(False, "build a raw pool to judge curation on (lait compare): stage 3 takes the alt and "
                             "context texts only and applies none of its rules, stage 5 drops no text as generic, "
                             "so the pool holds wrong pairs (docs/curation.md); what it turned off goes to demo.json")
    eval_pages: int = setting(0, "also write a held-out evaluation set into OUT/eval/ (karpathy.json and images/, "
                              "for `lait compare --eval`): the photos of a site of this many articles generated "
                              "with seed + 1 (0: none)")

    def validate(self) -> None:
        from lait.build.config import check_min_score

        if not self.out:
            raise ConfigError("--out is required")
        check_min_score(self.min_score)  # before the crawl, not after it
        from lait.storage import is_remote_url

        if is_remote_url(self.out):
            raise ConfigError("lait demo writes a local folder; run the stages yourself for a work "
                              "directory on object storage (lait crawl --out s3://..., lait run s3://...)")
        if self.pages < 1:
            raise ConfigError("--pages must be >= 1")
        if self.eval_pages < 0:
            raise ConfigError("--eval-pages must be >= 0")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# The alt attribute and the page's sentences beside an image: what a page offers every image
# without markup that ties a text to it. With the title, figcaption and og texts too, every demo
# photo has its true caption among its candidates, and stage 5 picks the best-scoring candidate
# of each picture: with every rule off that choice alone left no wrong pair (docs/curation.md).
RAW_POOL_SOURCES = ["alt", "context"]


def raw_pool_settings() -> dict[str, dict[str, Any]]:
    """What `--raw-pool` sets, per stage: the rules it turns off (every stage-3 rule that drops
    a text, stage 5's generic-text rule) and the sources it keeps."""
    from lait.filters.config import skippable_rules

    return {"clean": {"sources": list(RAW_POOL_SOURCES), "rules_off": list(skippable_rules())},
            "build": {"max_images_per_text": 0}}


def pipeline_sections(cfg: DemoConfig) -> dict[str, dict[str, Any]]:
    """The stage settings of the demo (what `lait run --config` would read from a YAML)."""
    sections: dict[str, dict[str, Any]] = {
        "filter": {},
        "clean": {"languages": list(cfg.languages)},
        # The tiny demo scorer packs all shape scenes into a narrow cone: different scenes reach
        # cosine 0.997, true re-encodes 0.9992+ (measured on the local web), so its
        # near-duplicate threshold is tighter than the 0.95 that suits a real CLIP.
        "score": {"model": "demo", "near_dup_threshold": 0.999},
        "build": {"samples_per_shard": cfg.samples_per_shard, "min_score": cfg.min_score},
    }
    if cfg.raw_pool:
        for stage, settings in raw_pool_settings().items():
            sections[stage].update(settings)
    return sections


def crawl_site(cfg: DemoConfig, work: Path) -> dict[str, Any]:
    """Serve the site and crawl it into `work`, unless an earlier demo run finished the crawl."""
    marker = work / CRAWL_MARKER
    if marker.exists():
        print(f"lait demo: reusing the finished crawl in {work}", file=sys.stderr)
        return json.loads(marker.read_text())
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    state = Path(cfg.out) / "demo.json"
    port = json.loads(state.read_text())["port"] if state.exists() else cfg.port
    if not _port_free(port):
        log.warning("port %d is taken; serving on a free port (an unfinished crawl starts over)", port)
        port = 0
    site = generate_site(cfg.pages, cfg.seed)
    site.write_ground_truth(Path(cfg.out) / "ground_truth.json")
    with SiteServer(site, port=port) as srv:
        atomic_write_json(state, {"port": srv.port, "pages": cfg.pages, "seed": cfg.seed})
        print(f"lait demo: local web at {srv.url}, crawling into {work}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        stats = crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(work), allow_loopback=True,
                                  autothrottle=False, concurrency=16, per_domain=16, log_level="WARNING"))
    if stats.get("finish_reason") == "shutdown":  # Ctrl-C: the crawl stopped cleanly
        raise KeyboardInterrupt("the crawl was stopped; run lait demo again to resume it")
    if stats.get("finish_reason") != "finished":
        raise RuntimeError(f"the crawl did not finish: {stats.get('finish_reason')}")
    summary = {"base_url": srv.url, "seconds": round(time.perf_counter() - start, 1),
               **{k: v for k, v in stats.items() if k.startswith("crawl/")}}
    atomic_write_json(marker, summary)
    return summary


def record_pool(cfg: DemoConfig, out: Path) -> None:
    """Say in OUT/demo.json (and on stderr) which pool this run builds: with `raw_pool`, the
    rules it turned off and the sources it kept, so that a reader of the work directory (and of
    `lait compare`'s table) knows its wrong pairs are on purpose."""
    state_path = out / "demo.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    state["raw_pool"] = raw_pool_settings() if cfg.raw_pool else None
    atomic_write_json(state_path, state)
    if cfg.raw_pool:
        raw = state["raw_pool"]
        print(f"lait demo: a raw pool: stage 3 takes only {' and '.join(raw['clean']['sources'])} texts and "
              f"applies none of its rules ({', '.join(raw['clean']['rules_off'])}); stage 5 drops no text as "
              "generic (max_images_per_text 0)", file=sys.stderr, flush=True)


def demo_documents(cfg: DemoConfig, work: Path):
    """`lait documents` on the demo's work directory, with the face settings of its build:
    (config, stats), or None when a pass failed (the pairs stand; the summary says so)."""
    from lait.app.documents import make_documents
    from lait.build.config import DocumentsConfig

    build = pipeline_sections(cfg).get("build", {})
    known = {f.name for f, _ in DocumentsConfig._fields()}
    docs = DocumentsConfig.from_dict({**{k: v for k, v in build.items() if k in known and k != "samples_per_shard"},
                                      "work": str(work), "workers": cfg.workers, "progress": cfg.progress})
    docs.validate()
    reports, stats = make_documents(docs)
    if stats is None:
        print("lait demo: the documents failed: " + "; ".join(r.summary() for r in reports if not r.ok), file=sys.stderr)
        return None
    return docs, stats


def run_demo(cfg: DemoConfig) -> int:
    from lait.app.report import summary_text, write_report
    from lait.app.run import run_pipeline
    from lait.drivers import open_work_dir
    from lait.lock import locked

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    with locked(open_work_dir(str(work), create=True), "lait demo"):
        crawl_site(cfg, work)
        overrides = {"workers": cfg.workers, "progress": cfg.progress}
        record_pool(cfg, out)
        if not run_pipeline(str(work), pipeline_sections(cfg), overrides=overrides, where="demo"):
            return 1
        docs = demo_documents(cfg, work)
    st, page = write_report(work, out / "report.html")
    print(summary_text(st))
    print(f"\nshards: {work / 'shards'}  ({st.shards} tars, {len(st.samples)} samples)")
    print(f"report: {page}")
    if docs is not None:
        from lait.app.documents import documents_line

        print(documents_line(*docs))
    from lait.testkit.groundtruth import evaluate_files

    res = evaluate_files(work / "shards", out / "ground_truth.json")
    print(f"ground truth of the local web: {out / 'ground_truth.json'} (the shards against it: precision "
          f"{res['precision']:.3f}, coverage {res['coverage']:.3f}"
          + (f"; a raw pool: {res['wrong']} of its {res['kept']} samples are wrong pairs, as intended)"
             if cfg.raw_pool else ")"))
    if cfg.eval_pages:
        from lait.testkit.heldout import write_heldout_set

        path = write_heldout_set(out / "eval", cfg.eval_pages, cfg.seed + 1)
        print(f"held-out evaluation set (a site of {cfg.eval_pages} articles, seed {cfg.seed + 1}): {path}")
    return 0 if docs is not None else 1


def register(sub) -> None:
    """Add `lait demo`."""
    from lait.app.commands import add_config_command

    add_config_command(sub, "demo", DemoConfig, run_demo,
                       help="the whole job offline on a built-in local web: shards + report",
                       description=DESCRIPTION, epilog="examples:\n  lait demo --out demo/\n"
                               "  lait demo --out demo/ --eval-pages 100      with a held-out set for lait compare\n"
                               "  lait demo --out raw/ --pages 400 --eval-pages 100 --raw-pool   a pool with wrong "
                               "pairs, to judge curation on")
