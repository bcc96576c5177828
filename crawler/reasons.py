"""The `crawl/...` drop reasons that the host, robots.txt and TDMRep rules add (issue 18).

Each is a request the crawler decided not to send, recorded in ``rejected/`` with the reason
below and a detail that names the host and the evidence; their sentences live in the one
registry, `lait.reasons`.
"""

from __future__ import annotations

HOST_DOWN = "crawl/host_down"
ROBOTS_UNREACHABLE = "crawl/robots_unreachable"
HOST_UNREACHABLE = "crawl/host_unreachable"
TDM_RESERVED = "crawl/tdm_reserved"
DECOMPRESSION_BOMB = "crawl/decompression_bomb"

# Error strings of pages/ and images/ rows (beside status_N, noai, ...): fetched, not kept.
ERROR_TDM_RESERVED = "tdm_reserved"
