"""A loopback HTTP server for a :class:`~lait.testkit.generator.Site` (or a real-web site).

HTTP/1.1 with keep-alive and Content-Length, one daemon thread per connection, an LRU cache
in front of ``site.route`` so that images render once, and quiet logs unless verbose.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

from lait.testkit.generator import Response

log = logging.getLogger(__name__)


class RoutableSite(Protocol):
    """What the server needs from a site: one function from a path to a response."""

    def route(self, path: str, base_url: str = "") -> Response: ...


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: every response carries Content-Length
    server: SiteServer

    def _answer(self, head_only: bool) -> None:
        host = self.headers.get("Host") or f"{self.server.host}:{self.server.port}"
        resp = self.server.respond(self.path, f"http://{host}")
        self.send_response(resp.status)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(resp.body)))
        for name, value in resp.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head_only:
            self.wfile.write(resp.body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._answer(head_only=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head_only=True)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        if self.server.verbose:
            log.info("%s %s", self.address_string(), format % args)


class SiteServer(ThreadingHTTPServer):
    """Serve ``site`` on ``host:port`` (port 0 picks a free port).

    Use as a context manager to serve from a background thread::

        with SiteServer(generate_site(200)) as srv:
            requests.get(srv.url + "/robots.txt")

    or call :meth:`serve_forever` in the foreground (the CLI does).
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # crawlers open many connections at once

    def __init__(self, site: RoutableSite, host: str = "127.0.0.1", port: int = 0,
                 verbose: bool = False, cache_size: int = 1024) -> None:
        super().__init__((host, port), _Handler)
        self.site = site
        self.verbose = verbose
        self.host = host
        self.port = self.server_address[1]
        # Keyed by (path, base_url); images are the expensive entries (one render each).
        self.respond = functools.lru_cache(maxsize=cache_size)(site.route)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    def handle_error(self, request, client_address) -> None:
        # A crawler that stops or gives up closes its connections mid-answer: no traceback.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)

    def start(self) -> SiteServer:
        """Serve from a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="lait-site",
                                        daemon=True)
        self._thread.start()
        log.debug("serving %s", self.url)
        return self

    def close(self) -> None:
        """Stop the background thread (if any) and close the socket."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()

    def __enter__(self) -> SiteServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


class SlowSite:
    """A site whose pages (not images) each answer after `delay` seconds: a crawl of it lasts
    long enough to be stopped or killed in the middle."""

    def __init__(self, site: RoutableSite, delay: float):
        self.site, self.delay = site, delay

    def route(self, path: str, base_url: str = ""):
        if path.endswith(".html") or path == "/":
            time.sleep(self.delay)
        return self.site.route(path, base_url)
