"""Downloader middleware and DNS resolver that keep the crawler off internal networks (SSRF).

A URL found on a web page can point anywhere: ``http://169.254.169.254/`` (cloud metadata),
``http://10.0.0.1/`` (a private network) or ``http://intranet.example/`` whose name resolves to
a private or loopback address. The crawler refuses such requests *after DNS resolution*:

- :class:`AddressGuardMiddleware` (downloader middleware, right after the offsite filter and
  before robots.txt, so not even robots.txt is requested) resolves the host, classifies every
  address and raises :class:`AddressRefused` (an ``IgnoreRequest``) with the reason, which the
  spider records in ``rejected/`` as ``crawl/refused_<kind>``;
- :class:`GuardedResolver` (``DNS_RESOLVER``) re-checks the address the connection actually
  uses, so a name that resolves to a public address first and a private one later (DNS
  rebinding) still cannot reach the internal network.

Settings: ``LAIT_ALLOW_LOOPBACK`` (the demo and tests), ``LAIT_ALLOW_PRIVATE`` (private,
shared, link-local and reserved ranges). Cloud metadata addresses are refused by both unless
``LAIT_ALLOW_METADATA`` is set too.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from scrapy.exceptions import IgnoreRequest
from scrapy.resolver import CachingThreadedResolver
from twisted.internet import threads
from twisted.internet.error import DNSLookupError

log = logging.getLogger(__name__)

# Cloud instance metadata endpoints (AWS/GCP/Azure/OpenStack, AWS IPv6, Alibaba, Oracle).
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192", "169.254.170.2"))


def classify_address(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Kind of an IP address: public, loopback, private, link_local, metadata or reserved."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "reserved"
    if ip.is_private or (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED):
        return "private"
    if not ip.is_global:
        return "reserved"
    return "public"


_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT


@dataclass(frozen=True)
class AddressPolicy:
    """Which non-public address kinds the crawler may connect to."""

    allow_loopback: bool = False
    allow_private: bool = False
    allow_metadata: bool = False

    @classmethod
    def from_settings(cls, settings) -> AddressPolicy:
        return cls(settings.getbool("LAIT_ALLOW_LOOPBACK"), settings.getbool("LAIT_ALLOW_PRIVATE"),
                   settings.getbool("LAIT_ALLOW_METADATA"))

    def allows(self, kind: str) -> bool:
        if kind == "public":
            return True
        if kind == "loopback":
            return self.allow_loopback
        if kind == "metadata":
            return self.allow_metadata and self.allow_private
        return self.allow_private  # private, link_local, reserved

    def refusal(self, addresses: list[str]) -> str | None:
        """The refused kind among `addresses` (the first one), or None when all are allowed."""
        for a in addresses:
            try:
                kind = classify_address(a)
            except ValueError:
                return "reserved"
            if not self.allows(kind):
                return kind
        return None


class AddressRefused(IgnoreRequest):
    """A request refused because its host resolves to an address the policy forbids."""

    def __init__(self, kind: str, host: str, address: str | None = None):
        self.kind = kind
        self.host = host
        self.address = address
        super().__init__(f"refused {kind} address for {host}" + (f" ({address})" if address else ""))

    @property
    def reason(self) -> str:
        return f"refused_{self.kind}"


def _host_addresses(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (blocking; run in a thread)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


class AddressGuardMiddleware:
    """Refuse requests whose host resolves to a forbidden address (see the module docstring)."""

    def __init__(self, policy: AddressPolicy, stats=None):
        self.policy = policy
        self.stats = stats
        self._verdicts: dict[str, tuple[str | None, str | None]] = {}  # host -> (kind, address)

    @classmethod
    def from_crawler(cls, crawler):
        global _active_policy
        policy = AddressPolicy.from_settings(crawler.settings)
        # The resolver is built from the process settings, before the spider applies its own
        # (`-a allow_loopback=true`): it follows the policy of the crawl running in this process.
        _active_policy = policy
        return cls(policy, crawler.stats)

    async def process_request(self, request, spider=None):
        parts = urlsplit(request.url)
        host = (parts.hostname or "").lower()
        if not host:
            return None
        verdict = self._verdicts.get(host)
        if verdict is None:
            verdict = await self._check(host, parts.port or (443 if parts.scheme == "https" else 80))
            self._verdicts[host] = verdict
        kind, address = verdict
        if kind is not None:
            # Counted (crawl/refused_<kind>) and recorded by the spider's errback.
            raise AddressRefused(kind, host, address)
        return None

    async def _check(self, host: str, port: int) -> tuple[str | None, str | None]:
        try:
            ip = ipaddress.ip_address(host.strip("[]"))
            addresses = [str(ip)]
        except ValueError:
            from scrapy.utils.defer import maybe_deferred_to_future

            try:
                addresses = await maybe_deferred_to_future(
                    threads.deferToThread(_host_addresses, host, port))
            except OSError:
                # Unresolvable: let the download fail with its own DNS error and status.
                return (None, None)
        for a in addresses:
            kind = self.policy.refusal([a])
            if kind is not None:
                log.info("refusing %s: resolves to %s address %s", host, kind, a)
                return (kind, a)
        return (None, None)


_active_policy: AddressPolicy | None = None


class GuardedResolver(CachingThreadedResolver):
    """Scrapy's caching resolver that fails for names resolving to a forbidden address.

    This guards the address the connection really uses; :class:`AddressGuardMiddleware`
    already refused (and recorded) the request in the common case. It applies the policy of
    the crawl of this process (set up by the middleware), else the process settings' one.
    """

    policy = AddressPolicy()

    @classmethod
    def from_crawler(cls, crawler, reactor):
        resolver = super().from_crawler(crawler, reactor)
        resolver.policy = AddressPolicy.from_settings(crawler.settings)
        return resolver

    def getHostByName(self, name, timeout=()):
        d = super().getHostByName(name, timeout)

        def check(address):
            kind = (_active_policy or self.policy).refusal([address])
            if kind is not None:
                raise DNSLookupError(f"{name} resolves to a refused {kind} address {address}")
            return address

        return d.addCallback(check)
