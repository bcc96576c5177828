"""Issue 18: the licence a page declares reaches every sample's JSON, through stages 2-5 run by
`lait run WORK` (offline: the demo scorer is built once per machine and cached)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from urllib.parse import urlsplit


def test_declared_licences_reach_the_shards(tmp_path):
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    site = generate_site(12, seed=2)
    truth = site.ground_truth()
    work = tmp_path / "work"
    with SiteServer(site) as srv:
        crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(work), allow_loopback=True, autothrottle=False,
                          log_level="WARNING", n_partitions=2), timeout=300, quiet=True)
    config = tmp_path / "pipeline.yaml"
    config.write_text("filter: {unsafe_model: none}\n"  # stage 2's model gates: not what this test is about
                      "score: {model: demo, near_dup_threshold: 0.999}\nbuild: {samples_per_shard: 50, face_model: none}\n")
    done = subprocess.run([sys.executable, "-m", "lait", "run", str(work), "--config", str(config),
                           "--workers", "1", "--no-progress"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    samples = []
    for tar in sorted((work / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                if m.name.endswith(".json"):
                    samples.append(json.load(io.TextIOWrapper(tf.extractfile(m))))
    assert samples
    declared = 0
    for s in samples:
        # Every sample has the key, a string: "" when its page declares nothing (one type per
        # key, docs/shards.md).
        assert "license" in s
        expected = truth["pages"][urlsplit(s["page_url"]).path]["license"]
        assert s["license"] == (expected or ""), (s["page_url"], s["license"], expected)
        declared += expected is not None
    assert declared and declared < len(samples)  # both kinds of pages are among the samples
