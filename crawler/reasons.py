"""The `crawl/...` drop reasons that the host, robots.txt and TDMRep rules add (issue 18).

Each is a request the crawler decided not to send, recorded in ``rejected/`` with the reason
below and a detail that names the host and the evidence. `REASONS` gives each one sentence, in
the shape of the core's registry of reasons, so they can be registered there as they are.
"""

from __future__ import annotations

HOST_DOWN = "crawl/host_down"
ROBOTS_UNREACHABLE = "crawl/robots_unreachable"
TDM_RESERVED = "crawl/tdm_reserved"

REASONS: dict[str, str] = {
    HOST_DOWN: "not requested: its host failed several times in a row (DNS, refused connection, "
               "timeout) and was marked down for the rest of the crawl",
    ROBOTS_UNREACHABLE: "not requested: the host's robots.txt could not be fetched (5xx, timeout, "
                        "connection failure), which RFC 9309 says means disallow all",
    TDM_RESERVED: "not requested or not kept: the publisher reserved text and data mining rights "
                  "(W3C TDMRep: /.well-known/tdmrep.json, tdm-reservation header or meta tag)",
}

# Error strings of pages/ and images/ rows (beside status_N, noai, ...): fetched, not kept.
ERROR_TDM_RESERVED = "tdm_reserved"
