"""`lait stats`: the dataset report of a work directory, as one offline HTML page and as text.

The page embeds everything (plots as PNG data URIs drawn with matplotlib's Agg backend, sample
thumbnails as JPEG data URIs), so it opens from a file, with no network and no server.

Sections: the funnel of every stage with counts per rejection reason; distributions (image
sizes, aspect ratios, scores, caption lengths, languages, domains, caption sources); a grid of
sample images with captions and scores; the best and the worst kept pairs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import tarfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from lait.build.shards import shard_files
from lait import storage
from lait.parts import WorkDir
from lait.reasons import REASONS
from lait.storage import Location

log = logging.getLogger(__name__)

FUNNEL = (("pages", "pages fetched"), ("images", "images fetched"), ("images_ok", "images kept by filter"),
          ("candidates", "image-page pairs with texts"), ("scored", "scored image-text pairs"),
          ("build_images", "images with scored texts"))
GRID_SAMPLES = 24
EXTREMES = 8
THUMB = 192


@dataclass
class DatasetStats:
    """Everything the report shows, gathered from the work directory's tables and shards."""

    root: str
    funnel: list[tuple[str, int]] = field(default_factory=list)
    rejects: Counter = field(default_factory=Counter)
    widths: list[int] = field(default_factory=list)
    heights: list[int] = field(default_factory=list)
    scored_scores: list[float] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # sidecar rows of kept samples
    shards: int = 0
    shard_bytes: int = 0

    @property
    def kept_scores(self) -> list[float]:
        return [s["score"] for s in self.samples]

    def counter(self, what: str) -> Counter:
        if what == "domains":
            return Counter(urlsplit(s["page_url"] or s["url"]).hostname or "?" for s in self.samples)
        return Counter(s[what] or "unknown" for s in self.samples)


def _column(work: WorkDir, table: str, column: str) -> list[Any]:
    out: list[Any] = []
    for f in work.part_files(table):
        pf = storage.parquet_file(f)
        if column in pf.schema_arrow.names:
            out += pf.read(columns=[column]).column(0).to_pylist()
    return out


def gather(work_root: str | Path) -> DatasetStats:
    """Read the counts, distributions and kept samples of a work directory (never image bytes)."""
    work = WorkDir(work_root)
    st = DatasetStats(work.url)
    for table, label in FUNNEL:
        if work.part_files(table):
            st.funnel.append((label, work.count(table)))
    st.rejects = Counter(_column(work, "rejected", "reason"))
    st.widths = _column(work, "images_ok", "width")
    st.heights = _column(work, "images_ok", "height")
    st.scored_scores = [float(s) for s in _column(work, "scored", "score")]
    for tar in shard_files(work):
        side = tar.with_suffix(".parquet")
        if storage.exists(side):
            rows = storage.read_table(side).to_pylist()
            st.samples += [dict(r, tar=tar.name) for r in rows if r["status"] == "success"]
        st.shards += 1
        st.shard_bytes += storage.size(tar)
    if st.samples:
        st.funnel.append(("samples in shards", len(st.samples)))
    return st


# -- terminal -------------------------------------------------------------------------------
def summary_text(st: DatasetStats) -> str:
    """The plain-text report: funnel, rejection reasons, shards and the main distributions."""
    lines = [f"lait dataset report: {st.root}", "", "funnel:"]
    width = max([len(label) for label, _ in st.funnel] + [10])
    lines += [f"  {label:<{width}}  {n:>10,}" for label, n in st.funnel]
    by_stage: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for reason, n in st.rejects.items():
        by_stage[reason.split("/", 1)[0]].append((reason, n))
    if by_stage:
        lines += ["", "rejected, by reason:"]
        for stage in sorted(by_stage):
            for reason, n in sorted(by_stage[stage], key=lambda x: (-x[1], x[0])):
                lines.append(f"  {reason:<40} {n:>10,}")
    lines += ["", f"shards: {st.shards} tars, {len(st.samples):,} samples, {st.shard_bytes / 1e6:.1f} MB"]
    if st.samples:
        ks = sorted(st.kept_scores)
        lines.append(f"kept scores: min {ks[0]:.3f}  median {ks[len(ks) // 2]:.3f}  max {ks[-1]:.3f}")
        for what in ("lang", "source"):
            top = ", ".join(f"{k} {v}" for k, v in st.counter(what).most_common(6))
            lines.append(f"{what}: {top}")
    return "\n".join(lines)


# -- plots ----------------------------------------------------------------------------------
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _barh(title: str, items: list[tuple[str, int]], color: str = "#4472c4") -> str | None:
    import matplotlib.pyplot as plt

    if not items:
        return None
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(items) + 1))
    labels = [k for k, _ in items][::-1]
    values = [v for _, v in items][::-1]
    ax.barh(labels, values, color=color)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:,}", va="center", fontsize=8)
    ax.set_title(title)
    ax.margins(x=0.15)
    return _png(fig)


def _hist(title: str, series: dict[str, list[float]], bins: int = 40, xlabel: str = "") -> str | None:
    import matplotlib.pyplot as plt

    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 3))
    for label, values in series.items():
        ax.hist(values, bins=bins, alpha=0.6, label=f"{label} ({len(values):,})")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=8)
    return _png(fig)


def plots(st: DatasetStats) -> list[tuple[str, str]]:
    """(title, data URI) of every plot that has data."""
    import matplotlib

    matplotlib.use("Agg")
    caption_lengths = [len(s["caption"].split()) for s in st.samples]
    aspects = [w / h for w, h in zip(st.widths, st.heights) if h]
    out = [
        ("Funnel", _barh("Rows at each stage", st.funnel)),
        ("Rejections", _barh("Rejected, by reason", st.rejects.most_common(30), "#c0504d")),
        ("Image sizes", _hist("Image sides (images kept by filter)", {"width": st.widths, "height": st.heights},
                              xlabel="pixels")),
        ("Aspect ratios", _hist("Aspect ratio (width / height)", {"images": aspects})),
        ("Scores", _hist("Image-text scores", {"all scored pairs": st.scored_scores, "kept captions": st.kept_scores},
                         xlabel="score")),
        ("Caption lengths", _hist("Caption length (kept)", {"words": caption_lengths}, bins=30, xlabel="words")),
        ("Languages", _barh("Caption languages", st.counter("lang").most_common(15))),
        ("Domains", _barh("Page domains", st.counter("domains").most_common(15))),
        ("Caption sources", _barh("Where captions come from", st.counter("source").most_common())),
    ]
    return [(t, uri) for t, uri in out if uri]


# -- samples --------------------------------------------------------------------------------
def thumbnails(shard_dir: Location, keys_by_tar: dict[str, set[str]]) -> dict[str, str]:
    """key -> JPEG data URI of a small thumbnail, read from the tars that hold the keys."""
    from PIL import Image

    out = {}
    for tar_name, keys in sorted(keys_by_tar.items()):
        with storage.open_input(shard_dir / tar_name) as f, tarfile.open(fileobj=f) as tf:
            for m in tf:
                key, _, ext = m.name.partition(".")
                if ext != "jpg" or key not in keys:
                    continue
                try:
                    with Image.open(tf.extractfile(m)) as im:
                        im.draft("RGB", (THUMB, THUMB))
                        im = im.convert("RGB")
                        im.thumbnail((THUMB, THUMB))
                        buf = io.BytesIO()
                        im.save(buf, "JPEG", quality=80)
                    out[key] = "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
                except Exception as exc:  # one broken thumbnail must not lose the report
                    log.warning("stats: no thumbnail for %s: %r", key, exc)
    return out


def _picked(st: DatasetStats) -> tuple[list[dict], list[dict], list[dict]]:
    grid = st.samples[:GRID_SAMPLES]
    ranked = sorted(st.samples, key=lambda s: (-s["score"], s["key"]))
    return grid, ranked[:EXTREMES], ranked[-EXTREMES:][::-1] if len(ranked) > EXTREMES else []


# -- HTML -----------------------------------------------------------------------------------
CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1280px}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plot img{max-width:620px;border:1px solid #eee}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:10px}
figure.sample{margin:0;border:1px solid #ddd;padding:4px;font-size:12px;background:#fafafa}
figure.sample img{width:100%;height:160px;object-fit:contain;background:#fff}
.score{color:#666}pre{background:#f4f4f4;padding:8px;font-size:12px}
"""


def _figure(s: dict, thumbs: dict[str, str]) -> str:
    src = thumbs.get(s["key"], "")
    return (f'<figure class="sample"><img alt="sample {html.escape(s["key"])}" src="{src}">'
            f'<figcaption>{html.escape(s["caption"])}<br><span class="score">score {s["score"]:.3f} · '
            f'{html.escape(s["source"])} · <a href="{html.escape(s["url"])}">image</a></span></figcaption></figure>')


def render_html(st: DatasetStats, plot_uris: list[tuple[str, str]], thumbs: dict[str, str]) -> str:
    grid, best, worst = _picked(st)
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td class=n>{n:,}</td></tr>" for k, n in st.funnel)
    rej = "".join(f"<tr><td>{html.escape(k)}</td><td class=n>{n:,}</td>"
                  f"<td>{html.escape(REASONS.get(k, ''))}</td></tr>"
                  for k, n in sorted(st.rejects.items(), key=lambda x: (x[0].split("/")[0], -x[1], x[0])))
    figs = "".join(f'<div class="plot"><img alt="{html.escape(t)}" src="{u}"></div>' for t, u in plot_uris)

    def section(title: str, items: list[dict], cls: str) -> str:
        if not items:
            return ""
        return (f'<h2>{title}</h2><div class="grid {cls}">' + "".join(_figure(s, thumbs) for s in items) + "</div>")

    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lait dataset report</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head>
<body>
<h1>lait dataset report</h1>
<p>{html.escape(st.root)} · {st.shards} shards · {len(st.samples):,} samples · {st.shard_bytes / 1e6:.1f} MB</p>
<h2>Funnel</h2><table id="funnel"><tr><th>stage</th><th>rows</th></tr>{rows}</table>
<h2>Rejected, by reason</h2><table id="rejects"><tr><th>reason</th><th>rows</th><th>meaning</th></tr>{rej}</table>
<h2>Distributions</h2><div class="plots" id="plots">{figs}</div>
{section("Samples", grid, "samples")}
{section("Best pairs", best, "best")}
{section("Worst kept pairs", worst, "worst")}
<h2>Summary</h2><pre>{html.escape(summary_text(st))}</pre>
</body></html>
"""


def write_report(work_root: str | Path, out: str | Path | None = None) -> tuple[DatasetStats, Path | None]:
    """Gather the stats and write the HTML page to `out` (when given); returns both."""
    st = gather(work_root)
    if out is None:
        return st, None
    grid, best, worst = _picked(st)
    wanted: dict[str, set[str]] = defaultdict(set)
    for s in grid + best + worst:
        wanted[s["tar"]].add(s["key"])
    thumbs = thumbnails(storage.location(work_root) / "shards", wanted)
    page = render_html(st, plots(st), thumbs)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return st, out


def stats_json(st: DatasetStats) -> str:
    return json.dumps({"funnel": st.funnel, "rejects": dict(st.rejects), "samples": len(st.samples),
                       "shards": st.shards}, indent=1)
