"""The hostile hosts of the built-in webs behave like the real web's worst, and say so."""

from __future__ import annotations

import socket
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest

from lait.testkit.hostile import KINDS, HostileHosts, kind_of


@pytest.fixture(scope="module")
def hosts():
    with HostileHosts(trickle_delay=0.2) as h:
        yield h


def _addr(hosts, kind):
    parts = urlsplit(hosts.base_url(kind))
    return parts.hostname, parts.port


def _get(address, path, timeout=2.0) -> bytes:
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
        return data


def test_each_kind_misbehaves_as_named(hosts):
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(_addr(hosts, "nxdomain")[0], 80)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(_addr(hosts, "refused"), timeout=2).close()
    with socket.create_connection(_addr(hosts, "blackhole"), timeout=2) as s:
        s.sendall(b"GET /robots.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(0.5)
        with pytest.raises(TimeoutError):
            s.recv(1)  # accepted, never answered
    trickle = ("127.0.0.4", _addr(hosts, "trickle")[1])
    assert b"Allow: /" in _get(trickle, "/robots.txt")  # robots.txt comes at once ...
    with socket.create_connection(trickle, timeout=2) as s:  # ... images a byte at a time
        s.sendall(b"GET /hostile/trickle/1.jpg HTTP/1.1\r\nHost: x\r\n\r\n")
        start, data = time.monotonic(), b""
        while time.monotonic() - start < 1.0:
            data += s.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        assert b"200" in head and 2 <= len(body) <= 10
    assert b"User-agent: lait\nDisallow: /hostile/" in _get(_addr(hosts, "robots"), "/robots.txt")
    tdm = ("127.0.0.6", _addr(hosts, "tdm")[1])
    assert b'"tdm-reservation": 1' in _get(tdm, "/.well-known/tdmrep.json")
    assert sorted(r.split(":")[0] for r in hosts.crawl_resolve()) == ["slow-cdn.lait.test", "tdm-cdn.lait.test"]


def test_synthetic_site_with_hostile_hosts(hosts):
    from lait.testkit.generator import generate_site

    site = generate_site(40, seed=3)
    plain = site.ground_truth()
    site.attach_hostile(hosts)
    truth = site.ground_truth()
    hostile = {u: t for u, t in truth["images"].items() if t.get("hostile")}
    assert set(truth["images"]) - set(plain["images"]) == set(hostile)
    assert {t["hostile"] for t in hostile.values()} == set(KINDS)
    for url, t in hostile.items():
        assert not t["keep"] and t["reason"] == KINDS[kind_of(url)].reason and t["reason"] in t["reasons"]
    page, refs = next((p, [r for r in t["images"] if r.get("hostile")])
                      for p, t in truth["pages"].items() if any(r.get("hostile") for r in t["images"]))
    html = site.route(page, "http://127.0.0.1:1").body.decode()
    for ref in refs:
        assert hosts.base_url(ref["hostile"]) + ref["url"] in html
    # Pages declare licences: a CC link or a licence meta, and the ground truth says which.
    assert Counter(t["license"] is not None for t in truth["pages"].values())[True] >= 20


def test_real_web_with_hostile_hosts(hosts, shared_data):
    from lait.testkit.realweb import RealWebSite

    site = RealWebSite(shared_data)
    site.attach_hostile(hosts)
    truth = site.ground_truth()
    kinds = Counter(t.get("hostile") for t in truth["images"].values())
    share = 1 - kinds[None] / len(truth["images"])
    assert set(kinds) - {None} == set(KINDS) and 0.05 < share < 0.4
    # All images of one original host go to one hostile host.
    by_host: dict[str, set] = {}
    for page in truth["pages"].values():
        for ref in page["images"]:
            if ref.get("original_url"):
                by_host.setdefault(urlsplit(ref["original_url"]).hostname, set()).add(kind_of(ref["url"]))
    assert all(len(k) == 1 for k in by_host.values())
    with pytest.raises(RuntimeError):
        site.attach_hostile(hosts)  # too late: pages are built
