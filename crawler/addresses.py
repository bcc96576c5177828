"""Which addresses the crawler may connect to: one classification of IP addresses and one policy.

`classify_address` says what kind an address is (public, loopback, private, link_local,
metadata, reserved); `AddressPolicy` says which kinds a run allows (``--allow-loopback``,
``--allow-private``). The crawler's address guard (`lait.crawler.middlewares`) applies them after
DNS resolution to every request; the URL-list reader (`lait.crawler.url_list`) applies them to
the page URLs a list names, which are never requested, when their host is an address
(`literal_address`). No Twisted here: the list reader runs in the command's own process.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

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


def literal_address(host: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a URL's host names without DNS: an IP literal in any spelling the system's
    resolver reads as one (`10.0.0.1`, `[::1]`, `0x7f.1`, `2130706433`), `localhost` and its
    subdomains as 127.0.0.1; None for any other name."""
    if not host:
        return None
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):  # RFC 6761: always loopback
        return ipaddress.IPv4Address("127.0.0.1")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if host and all(c in "0123456789abcdefx." for c in host) and host[0].isdigit():
        try:  # the legacy IPv4 forms getaddrinfo accepts: 127.1, 0x7f.1, 2130706433
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None
