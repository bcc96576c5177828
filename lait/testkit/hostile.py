"""Hostile hosts: the real web's worst image hosts, on loopback, for the built-in webs.

`HostileHosts` starts one host of each kind on its own loopback address (Linux routes all of
127.0.0.0/8 to the loopback interface); two are reached through names that only the crawler's
resolver override knows (`crawl_resolve`, ``lait crawl --resolve``):

========== ============================== ==============================================
kind       where                          what it does
========== ============================== ==============================================
nxdomain   ``nx.lait.invalid``            the name does not resolve (RFC 6761 .invalid)
refused    ``127.0.0.5``                  nothing listens: connections are refused
blackhole  ``127.0.0.3``                  accepts connections and never answers
trickle    ``slow-cdn.lait.test`` (.4)    answers robots.txt, then trickles image bytes
robots     ``127.0.0.2``                  robots.txt disallows its images to lait's group
tdm        ``tdm-cdn.lait.test`` (.6)     tdmrep.json reserves TDM rights on its images
========== ============================== ==============================================

`KINDS` names, for each kind, the reason a polite, robust crawl records for its images (in
``rejected/``, or as the error of an ``images/`` row): with robots.txt obeyed, the first three
never get past their robots.txt (``crawl/host_unreachable`` where no connection is made,
``crawl/robots_unreachable`` where the connection hangs; a host tried again later in a long
crawl may be marked down instead).

`HostileGallery` is a one-page site whose images all live on one host: the measure of what a
dead host costs a crawl (`bench/crawl/bench_hostile.py`, tests).
"""

from __future__ import annotations

import hashlib
import io
import logging
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

from lait.testkit.generator import Response

log = logging.getLogger(__name__)

HOSTILE_PREFIX = "/hostile/"
NXDOMAIN_HOST = "nx.lait.invalid"
TRICKLE_HOST = "slow-cdn.lait.test"
TDM_HOST = "tdm-cdn.lait.test"
ADDRESSES = {"robots": "127.0.0.2", "blackhole": "127.0.0.3", "trickle": "127.0.0.4",
             "refused": "127.0.0.5", "tdm": "127.0.0.6"}


@dataclass(frozen=True)
class HostileKind:
    """One kind of hostile host and the reasons its images may be recorded with."""

    name: str
    reason: str  # the reason of a default crawl (robots.txt obeyed, nothing retried later)
    reasons: tuple[str, ...]  # every reason that is right for it


_UNREACHABLE = ("crawl/robots_unreachable", "crawl/host_unreachable", "crawl/host_down")
KINDS: dict[str, HostileKind] = {k.name: k for k in (
    HostileKind("nxdomain", "crawl/host_unreachable", _UNREACHABLE + ("download/CannotResolveHostError",)),
    HostileKind("refused", "crawl/host_unreachable",
                _UNREACHABLE + ("download/DownloadConnectionRefusedError",)),
    HostileKind("blackhole", "crawl/robots_unreachable", _UNREACHABLE + ("download/DownloadTimeoutError",)),
    HostileKind("trickle", "crawl/host_down", ("crawl/host_down", "download/DownloadTimeoutError")),
    HostileKind("robots", "crawl/robots", ("crawl/robots",)),
    HostileKind("tdm", "crawl/tdm_reserved", ("crawl/tdm_reserved",)),
)}

ROBOTS_DISALLOWING_LAIT = (b"User-agent: *\nAllow: /\n\n"
                           b"# lait's own group: its images are not for datasets\n"
                           b"User-agent: lait\nDisallow: /hostile/\n")
TDMREP_RESERVING = (b'[{"location": "/hostile/*", "tdm-reservation": 1, '
                    b'"tdm-policy": "https://tdm-cdn.lait.test/policy.json"}, '
                    b'{"location": "/", "tdm-reservation": 0}]')


def _jpeg(seed: str, size: int = 320) -> bytes:
    h = hashlib.sha1(seed.encode()).digest()
    buf = io.BytesIO()
    Image.new("RGB", (size, size), tuple(h[:3])).save(buf, "JPEG", quality=80)
    return buf.getvalue()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _PoliteHostServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self.server.hits.append(self.path)
        path = self.path.split("?", 1)[0]
        kind = self.server.kind
        if path == "/robots.txt":
            body = ROBOTS_DISALLOWING_LAIT if kind == "robots" else b"User-agent: *\nAllow: /\n"
            return self._send(200, "text/plain", body)
        if path == "/.well-known/tdmrep.json" and kind == "tdm":
            return self._send(200, "application/json", TDMREP_RESERVING)
        if not path.startswith(HOSTILE_PREFIX):
            return self._send(404, "text/plain", b"not found")
        body = _jpeg(path)
        if kind != "trickle":
            return self._send(200, "image/jpeg", body)
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for i in range(len(body)):  # a byte at a time: no download limit but time ends it
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                if self.server.stopping.wait(self.server.trickle_delay):
                    return
        except OSError:  # the crawler gave up
            return

    def _send(self, status: int, ctype: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass


class _PoliteHostServer(ThreadingHTTPServer):
    """An HTTP host of one kind (trickle, robots, tdm) that records the paths it was asked for."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, kind: str, address: str, trickle_delay: float):
        super().__init__((address, 0), _Handler)
        self.kind = kind
        self.trickle_delay = trickle_delay
        self.hits: list[str] = []
        self.stopping = threading.Event()


class _BlackHole:
    """A listening socket that accepts connections and never answers them."""

    def __init__(self, address: str):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((address, 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="lait-blackhole", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            self.held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for conn in self.held:
            conn.close()
        self.sock.close()


def _closed_port(address: str) -> int:
    """A port nothing listens on at `address` (bound once, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class HostileHosts:
    """One hostile host of each kind in `KINDS`, on loopback (see the module docstring).

    Use as a context manager; `base_url(kind)` is where a kind's images live, `crawl_resolve()`
    the ``--resolve`` entries a crawl needs for the names, `image_url(kind, key)` an image URL.
    """

    def __init__(self, trickle_delay: float = 0.5):
        self.trickle_delay = trickle_delay
        self.servers: dict[str, _PoliteHostServer] = {}
        self.blackhole: _BlackHole | None = None
        self._threads: list[threading.Thread] = []
        self._urls: dict[str, str] = {}
        self._resolve: list[str] = []

    def start(self) -> HostileHosts:
        for kind in ("robots", "trickle", "tdm"):
            srv = _PoliteHostServer(kind, ADDRESSES[kind], self.trickle_delay)
            self.servers[kind] = srv
            t = threading.Thread(target=srv.serve_forever, name=f"lait-hostile-{kind}", daemon=True)
            t.start()
            self._threads.append(t)
        self.blackhole = _BlackHole(ADDRESSES["blackhole"])
        self.blackhole.start()
        trickle_port, tdm_port = self.servers["trickle"].server_address[1], self.servers["tdm"].server_address[1]
        refused_port = _closed_port(ADDRESSES["refused"])
        self._urls = {
            "nxdomain": f"http://{NXDOMAIN_HOST}:{refused_port}",
            "refused": f"http://{ADDRESSES['refused']}:{refused_port}",
            "blackhole": f"http://{ADDRESSES['blackhole']}:{self.blackhole.port}",
            "trickle": f"http://{TRICKLE_HOST}:{trickle_port}",
            "robots": f"http://{ADDRESSES['robots']}:{self.servers['robots'].server_address[1]}",
            "tdm": f"http://{TDM_HOST}:{tdm_port}",
        }
        self._resolve = [f"{TRICKLE_HOST}:{trickle_port}:{ADDRESSES['trickle']}",
                         f"{TDM_HOST}:{tdm_port}:{ADDRESSES['tdm']}"]
        return self

    def close(self) -> None:
        for srv in self.servers.values():
            srv.stopping.set()
            srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join()
        if self.blackhole is not None:
            self.blackhole.close()

    def __enter__(self) -> HostileHosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def base_url(self, kind: str) -> str:
        return self._urls[kind]

    def image_url(self, kind: str, key: str) -> str:
        return f"{self._urls[kind]}{image_path(kind, key)}"

    # What a site needs to show hostile images (without importing this module).
    @staticmethod
    def kinds() -> list[str]:
        return list(KINDS)

    @staticmethod
    def image_path(kind: str, key: str) -> str:
        return image_path(kind, key)

    @staticmethod
    def image_truth(path: str) -> dict:
        return image_truth(path)

    def crawl_resolve(self) -> list[str]:
        """``HOST:PORT:ADDRESS`` entries that make the hostile names reachable by the crawler."""
        return list(self._resolve)

    def hits(self, kind: str) -> list[str]:
        """Paths a kind's server was asked for (robots, trickle, tdm); the black hole counts
        connections instead (``blackhole.accepted``)."""
        return list(self.servers[kind].hits)


def image_path(kind: str, key: str) -> str:
    """The path of a hostile image: unique across kinds, so ground truth can key on it."""
    return f"{HOSTILE_PREFIX}{kind}/{key}.jpg"


def kind_of(path: str) -> str | None:
    """The hostile kind an image path belongs to, or None."""
    if not path.startswith(HOSTILE_PREFIX):
        return None
    kind = path[len(HOSTILE_PREFIX):].split("/", 1)[0]
    return kind if kind in KINDS else None


def image_truth(path: str) -> dict:
    """The ground-truth entry of a hostile image (never kept, for the reasons of its kind)."""
    kind = KINDS[kind_of(path)]
    return {"status": None, "width": None, "height": None, "format": None, "keep": False,
            "reason": kind.reason, "reasons": list(kind.reasons), "hostile": kind.name,
            "true_caption": None, "true_captions": [], "duplicate_of": None}


class HostileGallery:
    """A one-page site: `n` images, all on `image_base` (a hostile host's URL, or this site's)."""

    def __init__(self, n: int, image_base: str | None = None, kind: str = "blackhole"):
        self.n = n
        self.image_base = image_base
        self.kind = kind
        self._jpeg = _jpeg("gallery", 320)

    def route(self, path: str, base_url: str = "") -> Response:
        path = path.split("?", 1)[0]
        if path == "/robots.txt":
            return Response(200, "text/plain", b"User-agent: *\nAllow: /\n")
        if path == "/":
            base = self.image_base or base_url
            imgs = "".join(f'<figure><img src="{base}{image_path(self.kind, str(i))}" alt="photo {i}">'
                           f"</figure>\n" for i in range(self.n))
            html = f"<!DOCTYPE html><html><head><title>gallery</title></head><body>{imgs}</body></html>"
            return Response(200, "text/html; charset=utf-8", html.encode())
        if path.startswith(HOSTILE_PREFIX):
            time.sleep(0.002)  # a healthy host still takes a little time
            return Response(200, "image/jpeg", self._jpeg)
        return Response(404, "text/plain", b"not found")
