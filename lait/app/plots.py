"""The report's plots, drawn with matplotlib's Agg backend into data URIs (PNG) or, for the
score histogram, inline SVG: its threshold lines are elements of the page (`id="threshold-N"`),
so a browser, and a test, can find them."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from typing import Any

THRESHOLD_COLOR = "#c00000"


@dataclass
class Threshold:
    """A score cut of stage 5, as the histogram draws it."""

    value: float
    label: str


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def barh(title: str, items: list[tuple[str, int]], color: str = "#4472c4") -> str | None:
    if not items:
        return None
    fig, ax = _pyplot().subplots(figsize=(7, 0.35 * len(items) + 1))
    labels = [k for k, _ in items][::-1]
    values = [v for _, v in items][::-1]
    ax.barh(labels, values, color=color)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,}", va="center", fontsize=8)
    ax.set_title(title)
    ax.margins(x=0.15)
    return _png(fig)


def _hist_axes(title: str, series: dict[str, list[float]], bins: int, xlabel: str, outline_after: int = 99):
    """Histograms of `series` on one axes; those after the first `outline_after` are drawn as
    outlines, so that a series inside another stays visible."""
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None, None
    fig, ax = _pyplot().subplots(figsize=(7, 3))
    lo = min(min(v) for v in series.values())
    hi = max(max(v) for v in series.values())
    edges = bins if hi <= lo else [lo + (hi - lo) * i / bins for i in range(bins + 1)]  # shared bins
    for i, (label, values) in enumerate(series.items()):
        style = {"alpha": 0.6} if i < outline_after else {"histtype": "step", "linewidth": 1.6}
        ax.hist(values, bins=edges, label=f"{label} ({len(values):,})", **style)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    return fig, ax


def _legend(ax) -> None:
    """The legend beside the axes, never over a bar (inside, `loc="best"` still covers one
    when bars fill every corner)."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def hist(title: str, series: dict[str, list[float]], bins: int = 40, xlabel: str = "") -> str | None:
    fig, ax = _hist_axes(title, series, bins, xlabel)
    if fig is None:
        return None
    _legend(ax)
    return _png(fig)


def score_histogram_svg(series: dict[str, list[float]], thresholds: list[Threshold]) -> str | None:
    """The score histogram as an inline `<svg>`, each threshold a dashed vertical line in an
    element `threshold-N` with its label in the legend."""
    fig, ax = _hist_axes("Image-text scores", series, 40, "score", outline_after=1)
    if fig is None:
        return None
    for i, t in enumerate(thresholds):
        line = ax.axvline(t.value, color=THRESHOLD_COLOR, linestyle="--", linewidth=1.8, label=t.label)
        line.set_gid(f"threshold-{i}")
    _legend(ax)
    buf = io.StringIO()
    plt = _pyplot()
    with plt.rc_context({"svg.hashsalt": "lait-report", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]  # no XML declaration or DOCTYPE inside HTML


def plots(funnel_rows: list[Any], rejects: list[tuple[str, int]], widths: list[int], heights: list[int],
          samples: list[dict[str, Any]], counter) -> list[tuple[str, str]]:
    """(title, PNG data URI) of every plot that has data, but the score histogram."""
    caption_lengths = [len(s["caption"].split()) for s in samples]
    aspects = [w / h for w, h in zip(widths, heights) if h]
    out = []
    for unit in dict.fromkeys(r.unit for r in funnel_rows):  # one unit per plot, as per table row
        steps = [(r.step, r.count) for r in funnel_rows if r.unit == unit]
        if len(steps) > 1:
            out.append((f"Funnel: {unit}", barh(f"Funnel: {unit}", steps)))
    out += [
        ("Rejections", barh("Rejected, by reason", rejects[:30], "#c0504d")),
        ("Image sizes", hist("Image sides (images kept by filter)", {"width": widths, "height": heights},
                             xlabel="pixels")),
        ("Aspect ratios", hist("Aspect ratio (width / height)", {"images": aspects})),
        ("Caption lengths", hist("Caption length (kept)", {"words": caption_lengths}, bins=30, xlabel="words")),
        ("Languages", barh("Caption languages", counter("lang").most_common(15))),
        ("Domains", barh("Page domains", counter("domains").most_common(15))),
        ("Caption sources", barh("Where captions come from", counter("source").most_common())),
    ]
    return [(t, uri) for t, uri in out if uri]
