"""The report's "consent and safety" section: what each gate kept out of the dataset, counted.

A gate is a set of registered drop reasons (`lait.reasons`) that answer one question: did the
owner opt out, did the operator's lists exclude it, does the file itself reserve it. The
section lists every gate, with zeros, so that a reader sees which ones were there to act and
which removed nothing. A gate's reasons that are not registered (a detector another version
adds) are left out, so the section never names a rule the code does not have.
"""

from __future__ import annotations

import html
from collections import Counter

from lait.reasons import REASONS

# Gate -> its reasons, in pipeline order.
GATES: dict[str, tuple[str, ...]] = {
    "robots.txt": ("crawl/robots", "crawl/robots_unreachable"),
    "TDM reservation (W3C TDMRep)": ("crawl/tdm_reserved", "ingest/tdm_reserved_page", "filter/tdm_reserved",
                                     "clean/tdm_reserved"),
    "noai / noimageai": ("ingest/noai_page", "filter/noai", "clean/noai"),
    "domain and URL block lists": ("crawl/excluded_domain", "crawl/excluded_url", "ingest/excluded_domain",
                                   "ingest/excluded_url"),
    "image hash block list": ("filter/excluded_hash",),
    "reservation inside the image file (IPTC plus:DataMining)": ("filter/dmi_reserved",),
    "unsafe images": ("filter/unsafe",),
}


def consent_counts(rejects: Counter) -> dict[str, dict[str, int]]:
    """Gate -> {reason: rows dropped}, every registered reason of every gate listed."""
    out: dict[str, dict[str, int]] = {}
    for gate, reasons in GATES.items():
        known = {r: int(rejects.get(r, 0)) for r in reasons if r in REASONS}
        if known:
            out[gate] = known
    return out


def consent_text(rejects: Counter) -> list[str]:
    lines = ["consent and safety (rows each gate kept out):"]
    for gate, counts in consent_counts(rejects).items():
        detail = ", ".join(f"{r} {n:,}" for r, n in counts.items())
        lines.append(f"  {gate:<58} {sum(counts.values()):>8,}  ({detail})")
    return lines


def consent_html(rejects: Counter, anchor) -> str:
    """The section's table; a reason that dropped rows links to its examples (`anchor(reason)`)."""
    rows = []
    for gate, counts in consent_counts(rejects).items():
        reasons = ", ".join(f'<a href="#{anchor(r)}">{html.escape(r)}</a> {n:,}'
                            if n else f"{html.escape(r)} 0" for r, n in counts.items())
        rows.append(f'<tr data-gate="{html.escape(gate)}"><td>{html.escape(gate)}</td>'
                    f"<td class=n>{sum(counts.values()):,}</td><td>{reasons}</td></tr>")
    return ('<table id="consent"><tr><th>gate</th><th>rows kept out</th><th>by reason</th></tr>'
            + "".join(rows) + "</table>")
