"""Downloader middleware and DNS resolver that keep the crawler off internal networks (SSRF).

A URL found on a web page can point anywhere: ``http://169.254.169.254/`` (cloud metadata),
``http://10.0.0.1/`` (a private network) or ``http://intranet.example/`` whose name resolves to
a private or loopback address. The crawler refuses such requests *after DNS resolution*:

- :class:`AddressGuardMiddleware` (downloader middleware, right after the offsite filter and
  before robots.txt, so not even robots.txt is requested) resolves the host, classifies every
  address and raises :class:`AddressRefused` (an ``IgnoreRequest``) with the reason, which the
  spider records in ``rejected/`` as ``crawl/refused_<kind>``;
- :class:`GuardedResolver` (``TWISTED_DNS_RESOLVER``) re-checks the address the
  connection actually uses, so a name that resolves to a public address first and a private
  one later (DNS rebinding) still cannot reach the internal network.

Both answer from one cache of lookups (`lait.crawler.dns.dns_cache`), which also holds the
crawl's ``--resolve`` overrides.

Settings: ``LAIT_ALLOW_LOOPBACK`` (the demo and tests: every address that reaches this machine,
see `classify_address`), ``LAIT_ALLOW_PRIVATE`` (private, shared, link-local and reserved
ranges; never this machine's own addresses). Cloud metadata addresses are refused by both unless
``LAIT_ALLOW_METADATA`` is set too.
"""

from __future__ import annotations

import ipaddress
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from scrapy.exceptions import IgnoreRequest
from twisted.internet import defer
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolverSimple
from zope.interface import implementer

from lait.crawler.dns import dns_cache, parse_resolve

log = logging.getLogger(__name__)

# Cloud instance metadata endpoints (AWS/GCP/Azure/OpenStack, AWS IPv6, Alibaba, Oracle).
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192", "169.254.170.2"))


def classify_address(address: str | ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """Kind of an IP address: public, loopback, private, link_local, metadata or reserved.

    `loopback` is every address a connection to which reaches this machine: 127.0.0.0/8 and
    ::1, the unspecified addresses (0.0.0.0/8, ::: Linux connects them to the local host), the
    broadcast address, the addresses of this machine's own interfaces, and each of these
    wrapped in IPv6 (IPv4-mapped, IPv4-compatible, NAT64, 6to4)."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    ip = _unwrap(ip)
    if ip in METADATA_ADDRESSES:
        return "metadata"
    if ip.is_loopback or ip.is_unspecified or ip in _THIS_NETWORK or ip == _BROADCAST or ip in local_addresses():
        return "loopback"
    if ip.is_link_local:
        return "link_local"
    if ip.is_multicast or ip.is_reserved:
        return "reserved"
    if ip.is_private or (isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED):
        return "private"
    if not ip.is_global:
        return "reserved"
    return "public"


_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # "this host on this network" (RFC 1122)
_BROADCAST = ipaddress.ip_address("255.255.255.255")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_COMPATIBLE = ipaddress.ip_network("::/96")  # deprecated IPv4-compatible IPv6 (::a.b.c.d)


def _unwrap(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The IPv4 address an IPv6 form carries (mapped, compatible, NAT64, 6to4), else `ip`."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _COMPATIBLE and int(ip) > 1):  # not :: and ::1 themselves
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


_local: frozenset | None = None


def local_addresses() -> frozenset:
    """The addresses of this machine's interfaces (read once): a connection to any of them
    reaches this machine, whatever range it lies in."""
    global _local
    if _local is None:
        found: set = set()
        try:  # IPv4: the kernel's local routing table lists each local address as "/32 host LOCAL"
            lines = open("/proc/net/fib_trie").read().splitlines()
            for prev, line in zip(lines, lines[1:]):
                if "/32 host LOCAL" in line and "|--" in prev:
                    found.add(ipaddress.ip_address(prev.split("|--")[1].strip()))
        except OSError:
            pass
        try:  # IPv6: one address per line, 32 hex digits first
            for line in open("/proc/net/if_inet6"):
                h = line.split()[0]
                found.add(ipaddress.ip_address(":".join(h[i:i + 4] for i in range(0, 32, 4))))
        except (OSError, IndexError, ValueError):
            pass
        try:
            import socket

            for info in socket.getaddrinfo(socket.gethostname(), None):
                found.add(ipaddress.ip_address(info[4][0].split("%")[0]))
        except (OSError, ValueError):
            pass
        _local = frozenset(found)
    return _local


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


class AddressGuardMiddleware:
    """Refuse requests whose host resolves to a forbidden address (see the module docstring)."""

    def __init__(self, policy: AddressPolicy, stats=None):
        self.policy = policy
        self.stats = stats
        self._verdicts: dict[str, tuple[str | None, str | None]] = {}  # host -> (kind, address)

    @classmethod
    def from_crawler(cls, crawler):
        policy = AddressPolicy.from_settings(crawler.settings)
        # The resolver is built from the process settings, before the spider applies its own
        # (`-a allow_loopback=true`, `-a resolve=...`): it follows the crawl of this process.
        global _active_policy
        _active_policy = policy
        dns_cache.configure(parse_resolve(crawler.settings.getlist("LAIT_RESOLVE")),
                            crawler.settings.getfloat("DNS_TIMEOUT"))
        return cls(policy, crawler.stats)

    async def process_request(self, request, spider=None):
        parts = urlsplit(request.url)
        host = (parts.hostname or "").lower()
        if not host:
            return None
        verdict = self._verdicts.get(host)
        if verdict is None:
            verdict = await self._check(host)
            self._verdicts[host] = verdict
        kind, address = verdict
        if kind is not None:
            # Counted (crawl/refused_<kind>) and recorded by the spider's errback.
            raise AddressRefused(kind, host, address)
        return None

    async def _check(self, host: str) -> tuple[str | None, str | None]:
        from scrapy.utils.defer import maybe_deferred_to_future

        try:
            addresses = await maybe_deferred_to_future(dns_cache.lookup(host))
        except DNSLookupError:
            # Unresolvable: let the download fail with its own DNS error and status.
            return (None, None)
        finally:
            if self.stats is not None:  # names the system was asked for, each at most once
                self.stats.set_value("crawl/dns_lookups", dns_cache.lookups)
        for a in addresses:
            kind = self.policy.refusal([a])
            if kind is not None:
                log.info("refusing %s: resolves to %s address %s", host, kind, a)
                return (kind, a)
        return (None, None)


_active_policy: AddressPolicy | None = None


@implementer(IResolverSimple)
class GuardedResolver:
    """The reactor's resolver: answers from `lait.crawler.dns.dns_cache` (overrides, cached
    answers and failures), and fails for names resolving to an address the policy forbids.

    This guards the address the connection really uses; :class:`AddressGuardMiddleware`
    already refused (and recorded) the request in the common case. It applies the policy of
    the crawl of this process (set up by the middleware), else the process settings' one.
    """

    def __init__(self, reactor, policy: AddressPolicy | None = None):
        self.reactor = reactor
        self.policy = policy or AddressPolicy()

    @classmethod
    def from_crawler(cls, crawler, reactor):
        settings = crawler.settings
        dns_cache.configure(parse_resolve(settings.getlist("LAIT_RESOLVE")), settings.getfloat("DNS_TIMEOUT"))
        dns_cache.size = settings.getint("DNSCACHE_SIZE", 10_000)
        return cls(reactor, AddressPolicy.from_settings(settings))

    def install_on_reactor(self) -> None:
        self.reactor.installResolver(self)

    def getHostByName(self, name: str, timeout=()) -> defer.Deferred:  # noqa: N802 (Twisted's name)
        def pick(addresses: list[str]) -> str:
            v4 = [a for a in addresses if ":" not in a]
            if not v4:  # the HTTP client connects over IPv4, as Scrapy's own resolver does
                raise DNSLookupError(f"{name} has no IPv4 address")
            kind = (_active_policy or self.policy).refusal([v4[0]])
            if kind is not None:
                raise DNSLookupError(f"{name} resolves to a refused {kind} address {v4[0]}")
            return v4[0]

        return dns_cache.lookup(name).addCallback(pick)
