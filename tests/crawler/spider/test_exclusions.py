"""Issue 32 item 3: domain and URL block lists (UT1 format) apply before anything is fetched, on
every input path: the crawl, URL lists (`lait download`) and archives (`lait ingest-warc`); and
stage 2's hash list on real photos. One loopback server answers every host name (--resolve), and
logs each request with the Host it was sent to: nothing of a listed domain may be in that log,
not even its robots.txt, and every URL that was not fetched has its reason in rejected/."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from kit.pipeline_kit import NO_GATES
from lait.crawler.exclusions import DOMAIN, URL, ExclusionLists, load_lists
from lait.testkit.generator import Response
from lait.workdir import WorkDir

HTML = "text/html; charset=utf-8"
HOSTS = ("good.test", "bad.test", "cdn.bad.test", "notbad.test", "other.test")
LISTED_HOSTS = {"bad.test", "cdn.bad.test"}


def _jpeg(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (seed * 40 % 256, 90, 160)).save(buf, "JPEG")
    return buf.getvalue()


class LoggingSite:
    """Pages and images on several hosts; every request logged as (host, path)."""

    def __init__(self, photos: list[bytes] | None = None):
        self.log: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self.photos = photos or [_jpeg(i) for i in range(8)]
        self.port = 0

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    def route(self, path: str, base_url: str = "") -> Response:
        host = base_url.split("://", 1)[1].rsplit(":", 1)[0].lower()
        with self._lock:
            self.log.append((host, path))
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path == "/":
            links = "".join(f'<a href="{h}">l</a>' for h in (
                "/about.html", "/private/page.html", "/privateer.html", self.url("bad.test", "/page.html")))
            images = "".join(f'<img src="{src}" alt="a photo">' for src in (
                "/img/a.jpg", self.url("cdn.bad.test", "/img/b.jpg"), self.url("notbad.test", "/img/c.jpg"),
                self.url("other.test", "/listed/d.jpg"), self.url("other.test", "/img/e.jpg"),
                self.url("BAD.test", "/img/f.jpg"), "/img/redirect.jpg"))
            return Response(200, HTML, f"<html><body>{links}{images}</body></html>".encode())
        if path == "/img/redirect.jpg":  # a redirect onto a listed domain is refused too
            return Response(302, "text/plain", b"", {"Location": self.url("cdn.bad.test", "/img/g.jpg")})
        if path.endswith(".html"):
            return Response(200, HTML, b"<html><body><p>nothing here</p></body></html>")
        if path.endswith(".jpg"):
            return Response(200, "image/jpeg", self.photos[sum(path.encode()) % len(self.photos)])
        return Response(404, "text/plain", b"")

    def hosts_asked(self) -> set[str]:
        return {h for h, _ in self.log}


@pytest.fixture
def lists(tmp_path) -> tuple[Path, Path]:
    domains = tmp_path / "domains"
    domains.write_text("# UT1 style: one domain a line\nbad.test\n\nexample.invalid\n")
    urls = tmp_path / "urls"
    urls.write_text("www.good.test/private\nhttp://other.test/listed/\n")
    return domains, urls


@pytest.fixture
def site():
    from lait.testkit.server import SiteServer

    s = LoggingSite()
    with SiteServer(s, cache_size=0) as srv:
        s.port = srv.port
        yield s


def _resolve(site: LoggingSite) -> list[str]:
    return [f"{h}:*:127.0.0.1" for h in HOSTS]


def _tail(url: str) -> str:
    host, _, rest = url.split("://", 1)[1].partition("/")
    return f"{host.split(':')[0].lower()}/{rest}"


def _rejected(work: WorkDir) -> dict[str, str]:
    return {_tail(r["image_url"] or r["page_url"]): r["reason"] for r in work.iter_rows("rejected")}


# -- matching --------------------------------------------------------------------------------------

def test_matching_follows_ut1(lists):
    domains, urls = lists
    ex = load_lists(str(domains), str(urls))
    assert ex.match("http://bad.test/x") == (DOMAIN, "bad.test")
    assert ex.match("https://a.b.cdn.BAD.test:8443/x?y") == (DOMAIN, "bad.test")
    assert ex.match("http://notbad.test/x") is None and ex.match("http://bad.testing/") is None
    assert ex.match("http://good.test/private") == (URL, "good.test/private")
    assert ex.match("http://www.good.test/private/a/b.jpg?s=1") == (URL, "good.test/private")
    assert ex.match("http://good.test/privateer.html") is None
    assert ex.match("http://other.test/listed/d.jpg") == (URL, "other.test/listed")
    assert ex.match("http://sub.other.test/listed/d.jpg") is None  # URL entries name their host
    ips = ExclusionLists.of(domains=["10.1.2.3"])
    assert ips.match("http://10.1.2.3/a") == (DOMAIN, "10.1.2.3") and ips.match("http://1.2.3/") is None
    assert not load_lists("", "")


def test_a_missing_list_is_a_config_error(tmp_path):
    from lait.config import ConfigError
    from lait.crawler.config import CrawlConfig

    cfg = CrawlConfig(seeds=["http://a.test/"], out=str(tmp_path / "w"), exclude_domains=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="exclude_domains: .*nope is not a file"):
        cfg.validate()
    done = lait("download", str(tmp_path / "list.txt"), "--out", str(tmp_path / "w"),
                "--exclude-urls", str(tmp_path / "nope"))
    assert done.returncode != 0 and "exclude_urls" in done.stderr and "Traceback" not in done.stderr


# -- the crawl -------------------------------------------------------------------------------------

def test_crawl_never_asks_a_listed_domain(site, lists, tmp_path):
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl

    domains, urls = lists
    cfg = CrawlConfig(seeds=[site.url("good.test", "/")], out=str(tmp_path / "w"), allow_loopback=True,
                      autothrottle=False, log_level="WARNING", n_partitions=2, resolve=_resolve(site),
                      allowed_domains=["good.test", "bad.test"], exclude_domains=str(domains),
                      exclude_urls=str(urls))
    stats = crawl(cfg, timeout=120, quiet=True)
    work = WorkDir(tmp_path / "w")

    assert not site.hosts_asked() & LISTED_HOSTS, site.log  # robots.txt included
    assert not [p for _, p in site.log if p.startswith(("/private/", "/listed/"))]
    assert {("good.test", "/robots.txt"), ("other.test", "/robots.txt"), ("notbad.test", "/img/c.jpg"),
            ("good.test", "/privateer.html")} <= set(site.log)
    assert _rejected(work) == {
        "bad.test/page.html": "crawl/excluded_domain",
        "cdn.bad.test/img/b.jpg": "crawl/excluded_domain",
        "bad.test/img/f.jpg": "crawl/excluded_domain",
        # A redirect is refused under the URL the page showed (the one a resume or a rerun must
        # not request again); its detail names the target.
        "good.test/img/redirect.jpg": "crawl/excluded_domain",
        "good.test/private/page.html": "crawl/excluded_url",
        "other.test/listed/d.jpg": "crawl/excluded_url",
    }
    details = {_tail(r["image_url"] or r["page_url"]): r["detail"] for r in work.iter_rows("rejected")}
    assert details["good.test/img/redirect.jpg"].startswith(f"redirected to {site.url('cdn.bad.test', '/img/g.jpg')}: ")
    images = {_tail(r["image_url"]) for r in work.iter_rows("images", columns=["image_url", "bytes"])
              if r["bytes"]}
    assert images == {"good.test/img/a.jpg", "notbad.test/img/c.jpg", "other.test/img/e.jpg"}
    assert stats.get("crawl/excluded_domain") == 4 and stats.get("crawl/excluded_url") == 2


# -- URL lists, then stage 2's hash list, on real photos ------------------------------------------

def lait(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lait", *argv], capture_output=True, text=True, timeout=300)


def test_download_and_hash_list_on_real_photos(shared_data, lists, tmp_path):
    from lait.testkit.server import SiteServer

    photos = [p.read_bytes() for p in sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[:6]]
    site = LoggingSite(photos)
    domains, urls = lists
    with SiteServer(site, cache_size=0) as srv:
        site.port = srv.port
        rows = [site.url(h, f"/img/{i}.jpg") for i, h in enumerate(HOSTS)]
        rows += [site.url("other.test", "/listed/x.jpg"), site.url("good.test", "/img/6.jpg"),
                 site.url("notbad.test", "/img/7.jpg")]
        listing = tmp_path / "list.csv"
        listing.write_text("url,caption\n" + "".join(f"{u},a photo {i}\n" for i, u in enumerate(rows)))
        work = tmp_path / "w"
        done = lait("download", str(listing), "--out", str(work), "--allow-loopback", "--no-autothrottle",
                    "--resolve", *_resolve(site), "--exclude-domains", str(domains), "--exclude-urls", str(urls),
                    "--n-partitions", "2", "--no-progress", "-q")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not site.hosts_asked() & LISTED_HOSTS, site.log
    assert not [p for _, p in site.log if p.startswith("/listed/")]
    w = WorkDir(work)
    assert _rejected(w) == {"bad.test/img/1.jpg": "crawl/excluded_domain",
                            "cdn.bad.test/img/2.jpg": "crawl/excluded_domain",
                            "other.test/listed/x.jpg": "crawl/excluded_url"}
    fetched = {r["image_url"]: r["bytes"] for r in w.iter_rows("images") if r["bytes"]}
    assert len(fetched) == 5

    # Stage 2: one fetched photo listed by MD5, one by SHA-256 (the same photo may be served
    # under several URLs: every copy goes).
    by_md5, by_sha = sorted(set(fetched.values()))[:2]
    hashes = tmp_path / "hashes"
    hashes.write_text(f"{hashlib.md5(by_md5).hexdigest()}\nsha256:{hashlib.sha256(by_sha).hexdigest()}\n")
    # (Stage 2's model gates off: MTCNN on the real photos was half of this test's time.)
    done = lait("filter", str(work), *NO_GATES, "--exclude-hashes", str(hashes), "--min-side", "64", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    listed = {u for u, b in fetched.items() if b in (by_md5, by_sha)}
    reasons = {r["image_url"]: r["reason"] for r in w.iter_rows("rejected") if r["reason"].startswith("filter/")}
    assert {u: reasons.get(u) for u in listed} == {u: "filter/excluded_hash" for u in listed}
    kept = {r["image_url"] for r in w.iter_rows("images_ok")}
    assert kept == set(fetched) - listed and kept

    # The audit: `lait stats --json` and the HTML report count what each gate kept out.
    report = tmp_path / "report.html"
    done = lait("stats", str(work), "--json", "--html", str(report))
    assert done.returncode == 0, done.stderr[-3000:]
    gates = json.loads(done.stdout)["consent_and_safety"]
    assert gates["domain and URL block lists"] == {"crawl/excluded_domain": 2, "crawl/excluded_url": 1,
                                                   "ingest/excluded_domain": 0, "ingest/excluded_url": 0}
    assert gates["image hash block list"] == {"filter/excluded_hash": len(listed)}
    assert gates["reservation inside the image file (IPTC plus:DataMining)"] == {"filter/dmi_reserved": 0}
    page = report.read_text()
    assert "<h2>Consent and safety</h2>" in page
    row = re.search(r'<tr data-gate="image hash block list">(.*?)</tr>', page).group(1)
    assert f"<td class=n>{len(listed)}</td>" in row and 'href="#reason-filter-excluded_hash"' in row
    assert 'id="reason-filter-excluded_hash"' in page  # the link lands on the reason's examples


# -- archives --------------------------------------------------------------------------------------

def _warc(path: Path, site: LoggingSite) -> Path:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    def record(w, url, body, ctype):
        headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
        w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=headers))

    page = ('<html><body><p>A page.</p>'
            f'<img src="/img/a.jpg" alt="kept"><img src="{site.url("cdn.bad.test", "/img/b.jpg")}" alt="listed">'
            f'<img src="{site.url("other.test", "/listed/c.jpg")}" alt="listed url"></body></html>').encode()
    with open(path, "wb") as f:
        w = WARCWriter(f, gzip=True)
        record(w, site.url("good.test", "/index.html"), page, HTML)
        record(w, site.url("bad.test", "/index.html"), page, HTML)  # an archived page of a listed domain
        record(w, site.url("cdn.bad.test", "/archived.jpg"), _jpeg(1), "image/jpeg")
        record(w, site.url("good.test", "/private/archived.jpg"), _jpeg(2), "image/jpeg")
        record(w, site.url("good.test", "/archived.jpg"), _jpeg(3), "image/jpeg")
    return path


def test_ingest_warc_stores_and_fetches_nothing_listed(site, lists, tmp_path):
    domains, urls = lists
    warc = _warc(tmp_path / "a.warc.gz", site)
    work = tmp_path / "w"
    done = lait("ingest-warc", str(warc), "--out", str(work), "--allow-loopback", "--no-autothrottle",
                "--resolve", *_resolve(site), "--exclude-domains", str(domains), "--exclude-urls", str(urls),
                "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    assert not site.hosts_asked() & LISTED_HOSTS, site.log
    assert not [p for _, p in site.log if p.startswith(("/listed/", "/private/"))]
    assert ("good.test", "/img/a.jpg") in site.log
    w = WorkDir(work)
    assert _rejected(w) == {
        "bad.test/index.html": "ingest/excluded_domain",
        "cdn.bad.test/archived.jpg": "ingest/excluded_domain",
        "good.test/private/archived.jpg": "ingest/excluded_url",
        "cdn.bad.test/img/b.jpg": "crawl/excluded_domain",
        "other.test/listed/c.jpg": "crawl/excluded_url",
    }
    assert {_tail(r["url"]) for r in w.iter_rows("pages")} == {"good.test/index.html"}
    assert Counter(_tail(r["image_url"]) for r in w.iter_rows("images")) == {
        "good.test/archived.jpg": 1, "good.test/img/a.jpg": 1}
