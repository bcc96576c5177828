"""Real photos served as they are, from loopback hosts: the far end of a URL list or of an
archive's image references, for tests and benchmarks of `lait download` and `ingest-warc`.

`PhotoSite` answers the paths it was given with their bytes (typed by their suffix, so a page
ending in `.html` can show the photos to a crawler) and everything else with 404, plus
two kinds of broken answers real URL lists meet: `NOT_AN_IMAGE_PREFIX` paths answer 200 with
an HTML page, `MISSING_PREFIX` paths 404. `PhotoServer` serves one on a loopback address,
over HTTP or, with `tls=True`, HTTPS with a self-signed certificate (the crawler, like Scrapy,
does not verify certificates), so an archived `https://upload.wikimedia.org/...` can be
answered locally through the crawler's ``--resolve``. Linux routes all of 127.0.0.0/8 to the
loopback interface, so each host can have an address of its own.
"""

from __future__ import annotations

import datetime
import errno
import math
import random
import socket
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lait.testkit.generator import Response
from lait.testkit.server import RoutableSite, SiteServer

NOT_AN_IMAGE_PREFIX = "/not-an-image/"
MISSING_PREFIX = "/missing/"
TYPES = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".gif": "image/gif",
         ".webp": "image/webp", ".bmp": "image/bmp", ".tif": "image/tiff", ".tiff": "image/tiff",
         ".html": "text/html; charset=utf-8"}


class PhotoSite:
    """`files` (path, with its query if any -> bytes) served as images; see the module docstring."""

    def __init__(self, files: dict[str, bytes], delay: float = 0.0):
        self.files = dict(files)
        self.delay = delay  # seconds before each answer (a slow host, for stop-and-resume tests)
        self.hits: list[str] = []

    def route(self, path: str, base_url: str = "") -> Response:
        self.hits.append(path)
        if self.delay:
            time.sleep(self.delay)
        data = self.files.get(path)
        if data is not None:
            suffix = Path(path.split("?", 1)[0]).suffix.lower()
            return Response(200, TYPES.get(suffix, "image/jpeg"), data)
        if path.startswith(NOT_AN_IMAGE_PREFIX):
            return Response(200, "text/html; charset=utf-8",
                            b"<html><body><h1>Sign in to see this picture</h1></body></html>")
        return Response(404, "text/plain", b"not found")


class PhotoServer(SiteServer):
    """A `PhotoSite` on `host` (port 0: any free port), HTTP or HTTPS (`tls`)."""

    def __init__(self, site: PhotoSite, host: str = "127.0.0.1", port: int = 0, tls: bool = False):
        self.tls = tls
        self._context: ssl.SSLContext | None = None
        super().__init__(site, host=host, port=port, cache_size=0)
        if tls:
            self._context = _self_signed_context()

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        default = 443 if self.tls else 80
        return f"{scheme}://{self.host}" + ("" if self.port == default else f":{self.port}")

    def finish_request(self, request, client_address) -> None:
        # The TLS handshake happens here, in the connection's own thread, not in the accept loop.
        if self._context is not None:
            try:
                request = self._context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
        super().finish_request(request, client_address)


def _self_signed_context() -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate (cryptography, a Scrapy dependency)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lait test mirror")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=7)).sign(key, hashes.SHA256()))
    with tempfile.TemporaryDirectory() as tmp:
        cert_path, key_path = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
    return context


def free_loopback_address(port: int, tries: int = 50) -> str:
    """A loopback address (127.x.y.z) where `port` is free now: the way to serve a fixed port
    (443 for archived https URLs) beside other tests doing the same. PermissionError when this
    process may not bind that port at all (below 1024 without the privilege)."""
    rng = random.Random()
    for _ in range(tries):
        address = f"127.{rng.randrange(1, 255)}.{rng.randrange(0, 256)}.{rng.randrange(2, 255)}"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((address, port))
            except OSError as exc:
                if exc.errno == errno.EACCES:
                    raise PermissionError(f"cannot bind port {port}: {exc}") from None
                continue
        return address
    raise OSError(f"no loopback address with port {port} free after {tries} tries")


def coco_photos(folder: Path) -> list[tuple[Path, str]]:
    """(photo, its first human caption) of a COCO-format folder (`captions.json` beside the
    JPEGs, as ../shared/data/photos/coco_train), in file name order."""
    import json

    data = json.loads((Path(folder) / "captions.json").read_text())
    first: dict[int, tuple[int, str]] = {}
    for a in data["annotations"]:
        if a["image_id"] not in first or a["id"] < first[a["image_id"]][0]:
            first[a["image_id"]] = (a["id"], " ".join(a["caption"].split()))
    out = [(Path(folder) / im["file_name"], first[im["id"]][1]) for im in data["images"] if im["id"] in first]
    return sorted(out, key=lambda pc: pc[0].name)


def ingest_with_https_mirror(archive: Path, image_urls: list[str], photo_dir: Path, work: Path,
                             lait: Callable[..., Any]) -> PhotoSite:
    """`lait ingest-warc ARCHIVE --out WORK` with the archived https hosts of `image_urls` served
    on port 443 of a free loopback address (`--resolve`), a different real photo of `photo_dir`
    at each referenced path (with its query, as requested); `lait` runs the command (the test's
    subprocess helper). Skips where port 443 cannot be bound; returns the site, for its hits."""
    from urllib.parse import urlsplit

    import pytest

    try:
        address = free_loopback_address(443)
    except PermissionError as exc:
        pytest.skip(f"the mirror of the archived https hosts needs port 443: {exc}")
    files = {}
    for url, (photo, _) in zip(image_urls, coco_photos(photo_dir)):
        parts = urlsplit(url)
        files[parts.path + (f"?{parts.query}" if parts.query else "")] = photo.read_bytes()
    site = PhotoSite(files)
    hosts = sorted({urlsplit(u).hostname for u in image_urls})
    with PhotoServer(site, host=address, port=443, tls=True):
        done = lait("ingest-warc", str(archive), "--out", str(work), "--partitions", "4", "--allow-loopback",
                    "--resolve", *[f"{h}:443:{address}" for h in hosts], "--no-autothrottle",
                    "--log-level", "WARNING", "--no-progress")
    assert done.returncode == 0, done.stderr[-3000:]
    return site


class FlakySite:
    """A site that misbehaves for its first `flaky_seconds` (counted from its first request):
    then a `rate` share of requests, drawn with `seed`, gets a 503 or a 429 (both with a
    `Retry-After` of the seconds left in the bad spell, rounded up) or a stall of `stall`
    seconds before the answer; afterwards it answers as `site` does. `spare` paths (robots.txt,
    tdmrep.json), and with `only` the paths it refuses, always answer as `site` does, so that a
    test's bad spell hits the images. `log`
    lists every request as (path, what it got: the status, or "stall")."""

    def __init__(self, site: RoutableSite, *, flaky_seconds: float = 60.0, rate: float = 0.5,
                 stall: float = 5.0, seed: int = 0,
                 spare: tuple[str, ...] = ("/robots.txt", "/.well-known/tdmrep.json"),
                 only: Callable[[str], bool] | None = None):
        import threading

        self.site, self.flaky_seconds, self.rate, self.stall = site, flaky_seconds, rate, stall
        self.spare = spare
        self.only = only  # when given, only the paths it accepts misbehave (a crawl's images)
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._start: float | None = None
        self.log: list[tuple[str, str]] = []

    def route(self, path: str, base_url: str = "") -> Response:
        with self._lock:
            now = time.monotonic()
            if self._start is None:
                self._start = now
            left = self.flaky_seconds - (now - self._start)
            eligible = path not in self.spare and (self.only is None or self.only(path))
            bad = left > 0 and eligible and self._random.random() < self.rate
            kind = self._random.choice(["503", "429", "stall"]) if bad else None
        if kind in ("503", "429"):
            self.log.append((path, kind))
            return Response(int(kind), "text/plain", b"try again later",
                            {"Retry-After": str(max(1, math.ceil(left)))})
        if kind == "stall":
            self.log.append((path, "stall"))
            time.sleep(self.stall)
        resp = self.site.route(path, base_url)
        if kind is None:
            self.log.append((path, str(resp.status)))
        return resp
