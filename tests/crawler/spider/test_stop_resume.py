"""Issue 18, acceptance 5: one Ctrl-C stops `lait crawl` cleanly (what was fetched kept, one line
on how to resume); running the same command again completes the crawl, every page once. Issue 51:
the stopped command exits 128 + the signal (130 for SIGINT, 143 for SIGTERM), not 0, so a script
tells an interrupted crawl from a finished one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from lait.workdir import WorkDir


@pytest.mark.parametrize("jobdir,sig", [(False, signal.SIGINT), (True, signal.SIGTERM)],
                         ids=["sigint", "sigterm-jobdir"])
def test_one_signal_stops_cleanly_and_the_same_command_resumes(jobdir, sig, tmp_path, helpers):
    from lait.testkit.generator import generate_site
    from lait.testkit.hostile import HostileHosts
    from lait.testkit.server import SiteServer, SlowSite

    site = generate_site(40, seed=7)
    out = tmp_path / "work"
    with HostileHosts(trickle_delay=0.2) as hosts, SiteServer(SlowSite(site, 0.1)) as srv:
        site.attach_hostile(hosts)  # dead image hosts must not hold the stop, nor the resume
        cmd = [sys.executable, "-m", "lait", "crawl", "--seeds", srv.url + "/", "--out", str(out),
               "--allow-loopback", "--no-autothrottle", "--per-domain", "2", "--download-timeout", "2",
               "--n-partitions", "2", "--part-seconds", "0.5", "--log-level", "WARNING",
               "--resolve", *hosts.crawl_resolve()]
        if jobdir:
            cmd += ["--jobdir", str(tmp_path / "job")]
        proc = subprocess.Popen(cmd, env=helpers.crawler_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        work = WorkDir(out)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "lait.json").exists() and work.count("pages") >= 8:
                break
            time.sleep(0.05)
        proc.send_signal(sig)
        stderr = proc.communicate(timeout=60)[1]  # main hung here until a second Ctrl-C
        assert proc.returncode == 128 + sig, stderr[-3000:]
        resume_lines = [line for line in stderr.splitlines() if "to resume" in line]
        assert len(resume_lines) == 1 and str(out) in resume_lines[0], stderr[-3000:]
        assert '"finish_reason": "shutdown"' in stderr
        before = work.count("pages")
        expected = {p for p, t in site.ground_truth()["pages"].items() if not t["disallowed"]}
        assert 8 <= before < len(expected), "the stop did not land in the middle of the crawl"

        again = subprocess.run(cmd, env=helpers.crawler_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert '"finish_reason": "finished"' in again.stderr
    urls = Counter(u[len(srv.url):] for u in work.read("pages", columns=["url"]).column("url").to_pylist())
    assert [u for u, n in urls.items() if n > 1] == []
    assert expected - set(urls) == set()
    images = work.read("images", columns=["image_url"]).column("image_url").to_pylist()
    rejected = [r["image_url"] for r in work.read("rejected").to_pylist() if r["image_url"]]
    assert len(images) == len(set(images)) and len(rejected) == len(set(rejected))
    assert not set(images) & set(rejected)
