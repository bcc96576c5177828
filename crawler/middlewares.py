"""Downloader middleware and DNS resolver that keep the crawler off internal networks (SSRF).

A URL found on a web page can point anywhere: ``http://169.254.169.254/`` (cloud metadata),
``http://10.0.0.1/`` (a private network) or ``http://intranet.example/`` whose name resolves to
a private or loopback address. The crawler refuses such requests *after DNS resolution*:

- :class:`AddressGuardMiddleware` (downloader middleware, right after the offsite filter and
  before robots.txt, so not even robots.txt is requested) resolves the host, classifies every
  address (`lait.crawler.addresses`) and raises :class:`AddressRefused` (an ``IgnoreRequest``) with the reason, which the
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

import logging
from urllib.parse import urlsplit

from scrapy.exceptions import IgnoreRequest
from twisted.internet import defer
from twisted.internet.error import DNSLookupError
from twisted.internet.interfaces import IResolverSimple
from zope.interface import implementer

from lait.crawler.addresses import AddressPolicy, classify_address, local_addresses  # noqa: F401 (their old home)
from lait.crawler.dns import dns_cache, parse_resolve

log = logging.getLogger(__name__)


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
