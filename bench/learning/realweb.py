"""The offline scorer on the real-web mode: do planted photos keep their own human captions?

    python bench/learning/realweb.py [--work DIR] [--model imagenet-concepts]

The real pages of ../shared/data are served locally, each with planted COCO photos and one of
their human captions (`lait.testkit.realweb`); the spider crawls them, then stages 2 to 5 run
with default settings and the scorer named by --model. Printed:
- of the planted photos that reach the shards, the share whose sample caption is one of their
  own human captions (issue 31 asks for at least 95 %);
- the AUC of the scores of planted photos' own captions against the scores of the real page
  texts paired with the same photos in `scored/` (at least 0.9 asked), with how many of each;
- CPU seconds of the scoring stage per image.
The figures go to WORK/realweb.json too.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def norm(text: str) -> str:
    return " ".join(text.split())


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counted half (Mann-Whitney U / (n_pos n_neg))."""
    allv = np.concatenate([pos, neg])
    order = allv.argsort(kind="mergesort")
    ranks = np.empty(len(allv))
    sorted_v = allv[order]
    i = 0
    while i < len(allv):  # average ranks over ties
        j = i
        while j + 1 < len(allv) and sorted_v[j + 1] == sorted_v[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--model", default="imagenet-concepts", help="lait score --model")
    ap.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    args = ap.parse_args()
    if not (args.data / "html").is_dir():
        sys.exit(f"{args.data} is missing: the real-web mode needs ../shared/data")

    from lait.app.run import run_pipeline
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.drivers import open_work_dir
    from lait.testkit.realweb import RealWebSite
    from lait.testkit.server import SiteServer

    work = (args.work or Path(tempfile.mkdtemp(prefix="lait-realweb-"))) / "work"
    site = RealWebSite(args.data)
    truth = site.ground_truth()
    if not (work / "pages").exists():
        with SiteServer(site, port=0) as srv:
            crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(work), allow_loopback=True, autothrottle=False,
                              concurrency=16, per_domain=16, log_level="WARNING", n_partitions=8), quiet=True)
    t0, c0 = time.time(), cpu()
    ok = run_pipeline(str(work), {"filter": {}, "clean": {}, "score": {"model": args.model}, "build": {}},
                      overrides={"workers": 1, "progress": False}, where="bench")
    if not ok:
        sys.exit("the pipeline failed")
    pipeline_cpu, wall = cpu() - c0, time.time() - t0

    planted = {path: {norm(c) for c in info["true_captions"]} for path, info in truth["images"].items()
               if info["true_captions"]}
    samples = []
    for tar in sorted((work / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            samples += [json.loads(tf.extractfile(m).read()) for m in tf.getmembers() if m.name.endswith(".json")]
    reached = [s for s in samples if urlsplit(s["url"]).path in planted]
    own = [s for s in reached if norm(s["caption"]) in planted[urlsplit(s["url"]).path]]

    wd = open_work_dir(str(work))
    pos, neg, images = [], [], set()
    for row in wd.iter_rows("scored", columns=["image_url", "text", "score"]):
        path = urlsplit(row["image_url"]).path
        images.add(row["image_url"])
        if path not in planted:
            continue
        (pos if norm(row["text"]) in planted[path] else neg).append(row["score"])
    score_stats = json.loads((work / "_stats" / "score.json").read_text()) if (work / "_stats" / "score.json").is_file() else {}
    out = {
        "model": args.model,
        "samples": len(samples),
        "planted_photos": len(planted),
        "planted_in_shards": len(reached),
        "planted_with_own_caption": len(own),
        "own_caption_share": len(own) / max(1, len(reached)),
        "auc_own_vs_page_texts": auc(np.array(pos), np.array(neg)) if pos and neg else None,
        "own_caption_pairs": len(pos),
        "page_text_pairs": len(neg),
        "images_scored": len(images),
        "stages_2_to_5_cpu_s": pipeline_cpu,
        "stages_2_to_5_wall_s": wall,
        "score_stats": score_stats.get("counts") if isinstance(score_stats, dict) else None,
    }
    (work.parent / "realweb.json").write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))
    bad = [(urlsplit(s["url"]).path, s["caption"]) for s in reached if s not in own]
    for path, cap in bad[:10]:
        print(f"  not its own caption: {path}: {cap!r}")


if __name__ == "__main__":
    main()
