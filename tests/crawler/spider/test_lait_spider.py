"""Acceptance 1: the `lait` spider on the built-in local web, checked against its ground truth."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from urllib.parse import urlsplit

import pytest

from lait.workdir import WorkDir


def _path(url: str) -> str:
    p = urlsplit(url)
    return p.path + (f"?{p.query}" if p.query else "")


@pytest.fixture(scope="module")
def crawled(local_web, tmp_path_factory, helpers):
    from lait.crawler.run import crawl

    site, base = local_web
    out = tmp_path_factory.mktemp("crawl") / "work"
    stats = crawl(helpers.crawl_config(out, [base + "/"]), timeout=300, quiet=True)
    work = WorkDir(out)
    return {
        "truth": site.ground_truth(),
        "stats": stats,
        "pages": work.read("pages").to_pylist(),
        "images": work.read("images").to_pylist(),
        "rejected": work.read("rejected").to_pylist(),
        "work": work,
    }


def _referenced(truth: dict) -> dict[str, list[str]]:
    """Image URLs shown by each fetchable page (not robots-disallowed, not noai)."""
    return {path: [r["url"] for r in page["images"]] for path, page in truth["pages"].items()
            if not page["disallowed"] and not page["noai"]}


def test_every_allowed_page_fetched_once_and_stored(crawled):
    truth, pages = crawled["truth"], crawled["pages"]
    counts = Counter(_path(p["url"]) for p in pages)
    assert all(n == 1 for n in counts.values()), [u for u, n in counts.items() if n > 1]
    by_path = {_path(p["url"]): p for p in pages}
    for path, page in truth["pages"].items():
        if page["disallowed"]:
            continue
        row = by_path.get(path)
        assert row is not None, f"page {path} was not fetched"
        assert row["status"] == 200
        if page["noai"]:
            assert row["html"] is None and row["error"] == "noai"
        else:
            assert row["error"] is None and row["html"] and b"<html" in row["html"]
            assert row["content_type"].startswith("text/html")


def test_nothing_under_the_disallowed_prefix(crawled):
    prefix = crawled["truth"]["disallowed_prefix"]
    assert not [p["url"] for p in crawled["pages"] if _path(p["url"]).startswith(prefix)]
    assert not [i["image_url"] for i in crawled["images"] if _path(i["image_url"]).startswith(prefix)]
    robots = [r for r in crawled["rejected"] if r["reason"] == "crawl/robots"]
    assert robots and all(_path(r["page_url"]).startswith(prefix) for r in robots)


def test_every_listed_image_requested_exactly_once(crawled):
    truth, images = crawled["truth"], crawled["images"]
    counts = Counter(_path(i["image_url"]) for i in images)
    assert all(n == 1 for n in counts.values()), [u for u, n in counts.items() if n > 1]
    expected = {u for urls in _referenced(truth).values() for u in urls}
    assert expected - set(counts) == set()
    # Nothing but what the pages show (srcset's smaller candidates are not requested).
    assert set(counts) - expected == set()


def test_image_rows_match_their_truth(crawled):
    truth = crawled["truth"]["images"]
    for row in crawled["images"]:
        t = truth[_path(row["image_url"])]
        if t["reason"] == "crawl/status_404":
            assert row["status"] == 404 and row["bytes"] is None and row["error"] == "http_404"
        elif t["reason"] == "crawl/noai":
            assert row["status"] == 200 and row["bytes"] is None and row["error"] == "noai"
        else:
            assert row["status"] == 200 and row["error"] is None
            assert row["bytes"] and row["mime"].startswith("image/")
        assert row["page_url"]  # the page it was found on


def test_noai_image_and_404s_present(crawled):
    truth = crawled["truth"]
    reasons = {_path(i["image_url"]): truth["images"][_path(i["image_url"])]["reason"]
               for i in crawled["images"]}
    assert "crawl/noai" in reasons.values()
    assert "crawl/status_404" in reasons.values()
    by_path = {_path(p["url"]): p for p in crawled["pages"]}
    assert truth["broken_links"]
    for path in truth["broken_links"]:
        assert by_path[path]["status"] == 404 and by_path[path]["error"] == "http_404"


def test_images_of_the_noai_page_are_not_requested(crawled):
    truth = crawled["truth"]
    noai_only = {u for u, t in truth["images"].items() if t["reason"] == "crawl/noai_page"}
    fetched = {_path(i["image_url"]) for i in crawled["images"]}
    assert not noai_only & fetched


def test_parts_are_partitioned_by_url(crawled):
    from lait.workdir import partition_of

    work = crawled["work"]
    for table, key in (("pages", "url"), ("images", "image_url")):
        assert work.part_files(table)
        for part in work.partitions(table):
            for row in work.read(table, part, columns=[key]).to_pylist():
                assert partition_of(row[key], work.n_partitions) == part
            assert all(f.name.split("-", 1)[1].startswith("crawl-") for f in work.part_files(table, part))


def test_stats_count_what_was_written(crawled):
    stats = crawled["stats"]
    assert stats["finish_reason"] == "finished"
    assert stats["crawl/rows_pages"] == len(crawled["pages"])
    assert stats["crawl/rows_images"] == len(crawled["images"])
    assert stats["crawl/page_noai"] == 1 and stats["crawl/image_noai"] == 1


def test_max_pages_and_max_depth(local_web, tmp_path, helpers):
    from lait.crawler.run import crawl

    _, base = local_web
    crawl(helpers.crawl_config(tmp_path / "a", [base + "/"], max_pages=5, fetch_images=False), quiet=True)
    assert WorkDir(tmp_path / "a").count("pages") == 5
    assert WorkDir(tmp_path / "a").count("images") == 0
    crawl(helpers.crawl_config(tmp_path / "b", [base + "/about.html"], max_depth=1, fetch_images=False),
          quiet=True)
    pages = WorkDir(tmp_path / "b").read("pages", columns=["url", "depth"]).to_pylist()
    assert max(p["depth"] for p in pages) == 1
    # about.html links to the home page and the five categories (and the sitemap).
    assert {_path(p["url"]) for p in pages} >= {"/", "/about.html", "/category/shapes.html"}


def test_a_scrapy_closespider_limit_is_a_successful_stop(local_web, tmp_path, helpers, capsys):
    from lait.app.crawl import run

    _, base = local_web
    cfg = helpers.crawl_config(tmp_path / "w", [base + "/"], fetch_images=False, concurrency=1,
                               per_domain=1, scrapy_settings=["CLOSESPIDER_ITEMCOUNT=3"])
    assert run(cfg) == 0
    assert '"finish_reason": "closespider_itemcount"' in capsys.readouterr().err
    assert 3 <= WorkDir(tmp_path / "w").count("pages") < 10  # the site has over 40


def test_scrapy_crawl_lait_from_the_repo_root(local_web, tmp_path, repo_root, helpers):
    _, base = local_web
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"# the local web\n{base}/about.html\n")
    out = tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy", "crawl", "lait", "-a", f"seeds={seeds}", "-a", f"out={out}",
         "-a", "allow_loopback=true", "-a", "max_pages=3", "-a", "fetch_images=false",
         "-s", "LOG_LEVEL=WARNING", "-s", "AUTOTHROTTLE_ENABLED=false"],
        cwd=repo_root, env=helpers.crawler_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert WorkDir(out).count("pages") == 3
