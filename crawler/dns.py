"""Name resolution of the crawler: one cached answer per host, overrides, and the address guard.

A broad crawl meets thousands of hosts, some of whose names do not resolve or resolve slowly.
Scrapy's resolver caches only successes, so every request to a dead name asked the system
again, each lookup holding one of the reactor's few threads for up to ``DNS_TIMEOUT``. Here
every host is looked up once per process (`DnsCache`): concurrent lookups of one name share
one thread, answers are kept (``DNSCACHE_SIZE`` names), failures for `NEGATIVE_TTL` seconds,
and a lookup that outlasts ``DNS_TIMEOUT`` fails as a timeout.

Overrides (``LAIT_RESOLVE``, ``lait crawl --resolve HOST:PORT:ADDRESS``) answer a name with a
fixed address, as curl's ``--resolve`` does; the port is accepted for curl's syntax (``*`` or
a number) but Twisted resolves names without ports, so an override holds for every port of
its host. The address guard still applies to overridden names.

`lait.crawler.middlewares.GuardedResolver` (``TWISTED_DNS_RESOLVER``) answers the connections
from this cache.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import time
from collections import OrderedDict

from twisted.internet import defer, threads
from twisted.internet.error import DNSLookupError

from lait.urls import request_host

log = logging.getLogger(__name__)

NEGATIVE_TTL = 300.0  # seconds a failed lookup is remembered


def parse_resolve(entries: list[str]) -> dict[str, str]:
    """``HOST:PORT:ADDRESS`` entries (curl's ``--resolve``) as {host: address}.

    HOST may be a Unicode name (kept in its IDNA form, the one requests use); PORT is a number
    or ``*``; ADDRESS an IPv4 or IPv6 address (brackets allowed). Raises
    ValueError on a malformed entry or on one host given two addresses.
    """
    out: dict[str, str] = {}
    for entry in entries:
        parts = entry.strip().split(":", 2)
        if len(parts) != 3 or not parts[0]:
            raise ValueError(f"resolve entry {entry!r}: expected HOST:PORT:ADDRESS")
        host, port, address = request_host(parts[0]), parts[1], parts[2].strip("[]")
        if host is None:
            raise ValueError(f"resolve entry {entry!r}: {parts[0]!r} cannot be written as a host name (IDNA)")
        if port != "*" and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"resolve entry {entry!r}: PORT must be a number or *")
        try:
            address = str(ipaddress.ip_address(address))
        except ValueError:
            raise ValueError(f"resolve entry {entry!r}: {address!r} is not an IP address") from None
        if out.get(host, address) != address:
            raise ValueError(f"resolve entries give {host} two addresses ({out[host]}, {address})")
        out[host] = address
    return out


def _system_lookup(host: str) -> list[str]:
    """Every address of `host` (blocking; runs in a reactor thread), IPv4 first."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    return sorted(addresses, key=lambda a: ":" in a)


class DnsCache:
    """Addresses of host names, each looked up once (see the module docstring)."""

    def __init__(self, overrides: dict[str, str] | None = None, timeout: float = 10.0,
                 size: int = 10_000, negative_ttl: float = NEGATIVE_TTL):
        self.overrides = dict(overrides or {})
        self.timeout = timeout
        self.size = size
        self.negative_ttl = negative_ttl
        self._answers: OrderedDict[str, list[str]] = OrderedDict()
        self._failures: dict[str, tuple[float, str]] = {}  # host -> (when, why)
        self._pending: dict[str, list[defer.Deferred]] = {}
        self.lookups = 0  # system lookups started (the test of "each name once")

    def configure(self, overrides: dict[str, str], timeout: float | None = None) -> None:
        if overrides != self.overrides:
            self.overrides = dict(overrides)
            self._answers.clear()
            self._failures.clear()
        if timeout:
            self.timeout = timeout

    def cached(self, host: str) -> list[str] | None:
        return self._answers.get(host)

    def lookup(self, host: str) -> defer.Deferred:
        """A Deferred firing with the addresses of `host`, or failing with DNSLookupError."""
        host = host.lower().rstrip(".")
        literal = _literal(host)
        if literal is not None:
            return defer.succeed([literal])
        if host in self.overrides:
            return defer.succeed([self.overrides[host]])
        answer = self._answers.get(host)
        if answer is not None:
            self._answers.move_to_end(host)
            return defer.succeed(answer)
        failure = self._failures.get(host)
        if failure is not None and time.monotonic() - failure[0] < self.negative_ttl:
            return defer.fail(DNSLookupError(f"{host}: {failure[1]} (cached)"))
        waiter: defer.Deferred = defer.Deferred()
        waiting = self._pending.get(host)
        if waiting is not None:
            waiting.append(waiter)
            return waiter
        self._pending[host] = [waiter]
        self.lookups += 1
        from twisted.internet import reactor

        d = threads.deferToThread(_system_lookup, host)
        d.addTimeout(self.timeout, reactor)
        d.addCallbacks(self._resolved, self._failed, callbackArgs=(host,), errbackArgs=(host,))
        return waiter

    def _resolved(self, addresses: list[str], host: str) -> None:
        if not addresses:
            self._failed(None, host)
            return
        self._answers[host] = addresses
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)
        for waiter in self._pending.pop(host, []):
            waiter.callback(addresses)

    def _failed(self, failure, host: str) -> None:
        if failure is not None and failure.check(defer.TimeoutError):
            why = f"no answer within {self.timeout:g} s"
        elif failure is not None:
            why = str(failure.value) or type(failure.value).__name__
        else:
            why = "no address"
        self._failures[host] = (time.monotonic(), why)
        for waiter in self._pending.pop(host, []):
            waiter.errback(DNSLookupError(f"{host}: {why}"))


def _literal(host: str) -> str | None:
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


# One cache per crawler process: the reactor's resolver (`lait.crawler.middlewares.GuardedResolver`)
# and the address guard share it; the crawl's middlewares configure it from its settings.
dns_cache = DnsCache()
