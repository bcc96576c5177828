"""Acceptance 4: requests to metadata, private and loopback addresses are refused and recorded."""

from __future__ import annotations

import threading

import pytest

from lait.crawler.middlewares import AddressPolicy, classify_address


@pytest.mark.parametrize("address,kind", [
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
    ("10.0.0.1", "private"), ("172.16.5.4", "private"), ("192.168.1.1", "private"),
    ("100.64.0.1", "private"), ("fc00::1", "private"),
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("::ffff:10.0.0.1", "private"), ("::ffff:127.0.0.1", "loopback"),
    ("169.254.1.1", "link_local"), ("fe80::1", "link_local"),
    ("224.0.0.1", "reserved"), ("240.0.0.1", "reserved"),
    # Every form that reaches this machine is loopback, whatever range it lies in (issue 21).
    ("0.0.0.0", "loopback"), ("0.1.2.3", "loopback"), ("::", "loopback"), ("::ffff:0.0.0.0", "loopback"),
    ("255.255.255.255", "loopback"), ("::127.0.0.1", "loopback"), ("64:ff9b::7f00:1", "loopback"),
    ("2002:7f00:1::", "loopback"), ("2002:a00:1::", "private"), ("64:ff9b::a00:1", "private"),
    ("93.184.216.34", "public"), ("2606:4700::1111", "public"), ("8.8.8.8", "public"),
])
def test_classify_address(address, kind):
    assert classify_address(address) == kind


def test_this_machines_own_addresses_are_loopback():
    from lait.crawler.middlewares import local_addresses

    own = local_addresses()
    assert {"127.0.0.1"} <= {str(a) for a in own}
    for address in own:
        assert classify_address(address) == "loopback", address
        assert AddressPolicy(allow_private=True).refusal([str(address)]) == "loopback"


def test_policy_defaults_refuse_everything_internal():
    policy = AddressPolicy()
    assert policy.refusal(["8.8.8.8"]) is None
    for address, kind in (("127.0.0.1", "loopback"), ("10.1.2.3", "private"),
                          ("169.254.169.254", "metadata"), ("169.254.3.3", "link_local")):
        assert policy.refusal([address]) == kind
    # One forbidden address among several is enough to refuse the name.
    assert policy.refusal(["8.8.8.8", "10.0.0.1"]) == "private"


def test_policy_allowances():
    loop = AddressPolicy(allow_loopback=True)
    assert loop.refusal(["127.0.0.1"]) is None and loop.refusal(["10.0.0.1"]) == "private"
    private = AddressPolicy(allow_private=True)
    assert private.refusal(["10.0.0.1", "169.254.1.1"]) is None
    assert private.refusal(["127.0.0.1"]) == "loopback"
    assert private.refusal(["169.254.169.254"]) == "metadata"
    assert AddressPolicy(allow_private=True, allow_metadata=True).refusal(["169.254.169.254"]) is None


class _TrapSite:
    """One page linking to internal addresses; counts the requests it receives."""

    def __init__(self):
        self.hits: list[str] = []
        self.lock = threading.Lock()

    def route(self, path, base_url=""):
        from lait.testkit.generator import Response

        with self.lock:
            self.hits.append(path)
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nDisallow:\n")
        if path == "/":
            html = ('<html><body><a href="http://169.254.169.254/latest/meta-data/">meta</a>'
                    '<a href="http://10.0.0.1/admin">router</a>'
                    '<img src="http://10.0.0.2/cam.jpg" alt="camera">'
                    '<a href="/ok.html">fine</a></body></html>')
            return Response(200, "text/html; charset=utf-8", html.encode())
        if path == "/ok.html":
            return Response(200, "text/html; charset=utf-8", b"<html><body>ok</body></html>")
        return Response(404, "text/html", b"not found")


@pytest.fixture()
def trap():
    from lait.testkit.server import SiteServer

    site = _TrapSite()
    with SiteServer(site) as srv:
        yield site, srv


def test_links_to_internal_addresses_are_refused_and_recorded(trap, tmp_path, helpers):
    from lait.crawler.run import crawl
    from lait.workdir import WorkDir

    site, srv = trap
    # same_site off: the links leave the seed's host, so only the address guard stands in the way.
    cfg = helpers.crawl_config(tmp_path / "w", [srv.url + "/"], same_site=False,
                               download_timeout=5.0, retries=0)
    stats = crawl(cfg, timeout=120, quiet=True)
    work = WorkDir(tmp_path / "w")
    pages = {p["url"]: p for p in work.read("pages", columns=["url", "status"]).to_pylist()}
    assert set(pages) == {srv.url + "/", srv.url + "/ok.html"}
    rejected = {(r["reason"], r["page_url"] if r["image_url"] is None else r["image_url"])
                for r in work.read("rejected").to_pylist()}
    assert ("crawl/refused_metadata", "http://169.254.169.254/latest/meta-data/") in rejected
    assert ("crawl/refused_private", "http://10.0.0.1/admin") in rejected
    assert ("crawl/refused_private", "http://10.0.0.2/cam.jpg") in rejected
    assert work.count("images") == 0
    assert stats["crawl/refused_metadata"] == 1 and stats["crawl/refused_private"] == 2
    # Refused before any connection: no timeout or connection error was needed to stop them.
    errors = {k.rsplit("/", 1)[1] for k in stats if k.startswith("downloader/exception_type_count/")}
    assert errors <= {"lait.crawler.middlewares.AddressRefused"}, errors


def test_name_resolving_to_loopback_is_refused_when_not_allowed(trap, tmp_path, helpers):
    from lait.crawler.run import crawl
    from lait.workdir import WorkDir

    site, srv = trap
    seed = f"http://localhost:{srv.port}/"
    cfg = helpers.crawl_config(tmp_path / "w", [seed], allow_loopback=False, retries=0)
    stats = crawl(cfg, timeout=120, quiet=True)
    work = WorkDir(tmp_path / "w")
    assert work.count("pages") == 0
    rows = work.read("rejected").to_pylist()
    assert [(r["reason"], r["page_url"]) for r in rows] == [("crawl/refused_loopback", seed)]
    assert "127.0.0.1" in rows[0]["detail"] or "::1" in rows[0]["detail"]
    assert stats["crawl/refused_loopback"] == 1
    assert site.hits == []  # not even robots.txt was requested


@pytest.mark.parametrize("host", ["0.0.0.0", "0", "[::ffff:0.0.0.0]", "0x7f.1", "2130706433"])
def test_every_form_of_this_machine_is_refused_under_allow_private(trap, tmp_path, helpers, host):
    """With --allow-private and without --allow-loopback, no spelling of this machine reaches the
    server listening on 127.0.0.1: each seed is refused as loopback before any connection."""
    from lait.crawler.run import crawl
    from lait.workdir import WorkDir

    site, srv = trap
    seed = f"http://{host}:{srv.port}/"
    cfg = helpers.crawl_config(tmp_path / "w", [seed], allow_loopback=False, allow_private=True, retries=0,
                               download_timeout=5.0)
    crawl(cfg, timeout=120, quiet=True)
    work = WorkDir(tmp_path / "w")
    assert work.count("pages") == 0 and work.count("images") == 0
    rows = work.read("rejected").to_pylist()
    assert [r["reason"] for r in rows] == ["crawl/refused_loopback"], rows
    assert site.hits == []
