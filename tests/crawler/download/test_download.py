"""Issue 19: `lait download` of a URL list of real photos, then `lait run`, to shards.

The photos and their human captions are the COCO ones of ../shared/data, served as they are
from several loopback hosts (`tests/kit/photos.py`); the list has the broken rows real lists
have. Every row must end as a sample whose caption is the list's, or as a rejected/ row with
its reason. The fetcher is the crawler's: its rules (robots.txt, TDMRep, the address guard,
hosts marked down) apply to list rows as to a crawl's images.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from kit.photos import MISSING_PREFIX, NOT_AN_IMAGE_PREFIX, PhotoServer, PhotoSite, coco_photos
from kit.pipeline_kit import write_csv
from lait.workdir import WorkDir

UNREACHABLE = {"crawl/host_unreachable", "crawl/host_down"}
PIPELINE = "clean: {languages: [en]}\nscore: {model: demo, near_dup_threshold: 0.999}\nbuild: {samples_per_shard: 20}\n"


def lait(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=timeout)


def closed_port(address: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def shard_samples(work: Path) -> dict[str, dict]:
    """url -> the sample's JSON, with the sha256 of its image bytes."""
    out = {}
    for tar in sorted((work / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: m for m in tf.getmembers()}
            for name, m in members.items():
                if name.endswith(".json"):
                    sample = json.load(io.TextIOWrapper(tf.extractfile(m)))
                    image = tf.extractfile(members[name[:-5] + ".jpg"]).read()
                    sample["_image_sha256"] = hashlib.sha256(image).hexdigest()
                    out[sample["url"]] = sample
    return out


@pytest.fixture(scope="module")
def coco(shared_data):
    return coco_photos(shared_data / "photos" / "coco_train")


@pytest.fixture
def photo_hosts(coco):
    """Three hosts on their own loopback addresses, each serving 8 of the photos."""
    servers = []
    for i in range(3):
        files = {f"/coco/{p.name}": p.read_bytes() for p, _ in coco[i * 8:(i + 1) * 8]}
        servers.append(PhotoServer(PhotoSite(files), host=f"127.0.19.{i + 1}").start())
    yield servers
    for s in servers:
        s.close()


def test_url_list_of_real_photos_to_shards(coco, photo_hosts, tmp_path):
    good = []
    for i, server in enumerate(photo_hosts):
        for photo, caption in coco[i * 8:(i + 1) * 8]:
            good.append({"url": f"{server.url}/coco/{photo.name}", "caption": caption, "file": photo.name})
    broken = {
        "404": {"url": f"{photo_hosts[0].url}{MISSING_PREFIX}gone.jpg", "caption": "A photo that is gone now."},
        "not_image": {"url": f"{photo_hosts[1].url}{NOT_AN_IMAGE_PREFIX}login.jpg",
                      "caption": "A login page instead of a photo."},
        "refused": {"url": f"http://127.0.19.9:{closed_port('127.0.19.9')}/a.jpg",
                    "caption": "A host where nothing listens."},
        "nxdomain": {"url": "http://photos.lait.invalid/b.jpg", "caption": "A host whose name does not resolve."},
        "bad_url": {"url": "ftp://photos.example/c.jpg", "caption": "Not something to fetch over HTTP."},
        "duplicate": {"url": good[3]["url"], "caption": "The same photo listed twice."},
    }
    rows = [{"url": r["url"], "caption": r["caption"], "id": str(n)} for n, r in enumerate(good)]
    rows += [{"url": r["url"], "caption": r["caption"], "id": kind} for kind, r in broken.items()]
    listing = write_csv(tmp_path / "photos.csv", rows)
    work = tmp_path / "W"

    done = lait("download", str(listing), "--out", str(work), "--allow-loopback", "--no-autothrottle",
                "--concurrency", "16", "--processes", "2", "--n-partitions", "4", "--save-additional-columns", "id",
                "--download-timeout", "10", "--log-level", "WARNING", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rows read now: 30, kept: 28, download/bad_url: 1, download/duplicate_url: 1" in done.stderr
    (tmp_path / "pipeline.yaml").write_text(PIPELINE)
    done = lait("run", str(work), "--config", str(tmp_path / "pipeline.yaml"), "--workers", "1", "--no-progress",
                timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    samples = shard_samples(work)
    rejected = WorkDir(work).read("rejected").to_pylist()
    reasons: dict[str, set[str]] = {}
    for r in rejected:
        reasons.setdefault(r["image_url"], set()).add(r["reason"])
    # Every row: a sample with the list's caption and the photo's own bytes, or a reason.
    for row in good:
        url = row["url"]
        if url in samples:
            s = samples[url]
            assert s["caption"] == row["caption"] and s["source"] == "list", s
            assert s["page_url"] == ""  # the list has no page column
            photo = next(p for p, _ in coco if p.name == row["file"])
            # The photo's own bytes, unless faces were found in it: those are blurred (issue 32).
            same = s["_image_sha256"] == hashlib.sha256(photo.read_bytes()).hexdigest()
            assert same != bool(s["face_bboxes"]), (s["face_bboxes"], same)
            # KEY.json names the bytes shipped, blurred or not, and the file as fetched (issue 59).
            assert s["sha256"] == s["_image_sha256"]
            assert s["fetched_sha256"] == hashlib.sha256(photo.read_bytes()).hexdigest()
        else:
            assert reasons.get(url), f"{url}: neither a sample nor a reason"
    assert len(samples) >= 20, f"only {len(samples)} of 24 photos became samples: {reasons}"
    assert set(samples) <= {r["url"] for r in good}
    assert reasons[broken["404"]["url"]] == {"filter/status"}
    assert reasons[broken["not_image"]["url"]] == {"filter/not_image"}
    assert reasons[broken["refused"]["url"]] & UNREACHABLE
    assert reasons[broken["nxdomain"]["url"]] & UNREACHABLE
    # rejected/'s URL columns hold http(s) URLs only: the ftp URL is kept as text in the detail
    assert [r["reason"] for r in rejected if repr(broken["bad_url"]["url"]) in (r["detail"] or "")] == \
        ["download/bad_url"]
    (dup,) = [r for r in rejected if r["reason"] == "download/duplicate_url"]
    assert dup["image_url"] == broken["duplicate"]["url"] and "row 30: the URL of photos.csv row 4" in dup["detail"]
    # The list's extra column is kept with its row.
    kept = {r["image_url"]: json.loads(r["extra"]) for r in WorkDir(work).iter_rows("url_list")}
    assert kept[good[5]["url"]] == {"id": "5"}


def test_the_crawlers_rules_apply_to_list_rows(tmp_path):
    from lait.testkit.hostile import KINDS, HostileHosts

    with HostileHosts(trickle_delay=0.5) as hosts:
        urls = {kind: hosts.image_url(kind, f"list-{kind}") for kind in KINDS}
        listing = write_csv(tmp_path / "hostile.csv", [{"url": u, "caption": f"a {k} picture"} for k, u in urls.items()])
        done = lait("download", str(listing), "--out", str(tmp_path / "W"), "--allow-loopback",
                    "--no-autothrottle", "--download-timeout", "3", "--retries", "0",
                    "--resolve", *hosts.crawl_resolve(), "--log-level", "WARNING", "--no-progress")
        assert done.returncode == 0, done.stderr[-3000:]
        # Without --allow-loopback, the address guard refuses every one of them.
        done = lait("download", str(listing), "--out", str(tmp_path / "guarded"), "--no-autothrottle",
                    "--resolve", *hosts.crawl_resolve(), "--log-level", "WARNING", "--no-progress")
        assert done.returncode == 0, done.stderr[-3000:]
    work = WorkDir(tmp_path / "W")
    outcome = {r["image_url"]: r["reason"] for r in work.iter_rows("rejected")}
    outcome.update({r["image_url"]: r["error"] for r in work.iter_rows("images") if r["error"]})
    for kind, url in urls.items():
        assert outcome.get(url) in KINDS[kind].reasons, (kind, outcome.get(url))
    guarded = {r["image_url"]: r["reason"] for r in WorkDir(tmp_path / "guarded").iter_rows("rejected")}
    assert {u: guarded.get(u) for u in urls.values() if "invalid" not in u} == \
        {u: "crawl/refused_loopback" for u in urls.values() if "invalid" not in u}


def test_stop_and_resume_fetches_each_image_once(coco, tmp_path):
    files = {f"/slow/{p.name}": p.read_bytes() for p, _ in coco[:40]}
    sites = [PhotoSite(dict(list(files.items())[i::2]), delay=0.4) for i in range(2)]
    servers = [PhotoServer(site, host=f"127.0.19.{11 + i}").start() for i, site in enumerate(sites)]
    try:
        rows = [{"url": f"{srv.url}{path}", "caption": "a photo"} for srv, site in zip(servers, sites)
                for path in site.files]
        listing = write_csv(tmp_path / "slow.csv", rows)
        argv = [sys.executable, "-m", "lait", "download", str(listing), "--out", str(tmp_path / "W"),
                "--allow-loopback", "--no-autothrottle", "--per-domain", "2", "--processes", "2",
                "--log-level", "WARNING", "--no-progress"]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while sum(len(s.hits) for s in sites) < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err[-3000:]  # stopped, not finished (issue 51)
        assert "run the same command again to resume" in err
        first = WorkDir(tmp_path / "W").count("images")
        assert 0 < first < len(rows)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        for s in servers:
            s.close()
    urls = [r["image_url"] for r in WorkDir(tmp_path / "W").iter_rows("images", columns=["image_url", "error"])
            if r]
    assert sorted(urls) == sorted(r["url"] for r in rows)  # every image once
    assert all(r["error"] is None for r in WorkDir(tmp_path / "W").iter_rows("images"))
    # The second run asked only for what the first had not stored (and robots.txt again).
    image_hits = [h for s in sites for h in s.hits if h.startswith("/slow/")]
    assert len(image_hits) < len(rows) + 16  # at most a cancelled download in flight per slot


def test_fetcher_processes_split_the_hosts_and_add_up_their_stats():
    from lait.crawler.config import host_share
    from lait.crawler.run import merge_stats, stopped_status

    urls = [f"http://h{i}.test/{j}.jpg" for i in range(40) for j in range(3)]
    shares = {u: host_share(u, 3) for u in urls}
    for i in range(40):  # a host's images all go to one process ...
        assert len({shares[f"http://h{i}.test/{j}.jpg"] for j in range(3)}) == 1
    assert set(shares.values()) == {0, 1, 2}  # ... and every process gets hosts
    merged = merge_stats([
        {"crawl/image_ok": 3, "elapsed_time_seconds": 5.0, "finish_reason": "shutdown", "memusage/max": 10,
         "lait/stop_signal": 15},
        {"crawl/image_ok": 4, "crawl/host_down": 1, "elapsed_time_seconds": 7.0, "finish_reason": "shutdown",
         "memusage/max": 8, "lait/stop_signal": 15}])
    assert merged == {"crawl/image_ok": 7, "crawl/host_down": 1, "elapsed_time_seconds": 7.0,
                      "memusage/max": 10, "finish_reason": "shutdown", "lait/stop_signal": 15}
    assert stopped_status(merged) == 143  # one SIGTERM, whatever the number of processes (issue 51)
    assert merge_stats([{"finish_reason": "finished"}, {"finish_reason": "closespider_error"}])["finish_reason"] \
        == "closespider_error"
