"""`lait stats`: the dataset report of a work directory, as one offline HTML page and as text.

The page embeds everything (plots as PNG data URIs and the score histogram as inline SVG, drawn
with matplotlib's Agg backend; thumbnails as JPEG data URIs), so it opens from a file, with no
network and no server. The pages it links to are the stored copies written beside it
(`lait.app.pagecopies`), never the live web, which may be gone (the demo's is, once it ends).

Sections: the funnel, one unit per row (pages, images, image-page pairs, image-text pairs,
samples) with shares, what each row counts and what was dropped between two rows, by reason
(`lait.app.funnel`); every rejection reason,
sorted, with what a row of it is and examples of what it dropped (`lait.app.examples`); what
each consent and safety gate kept out (`lait.app.consent`); the
score histogram with stage 5's thresholds drawn on it; distributions (image sizes, aspect
ratios, caption lengths, languages, domains, caption sources); a grid of samples and the best
and worst kept pairs, each linked to the page it came from.
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

from lait import storage
from lait.app.consent import consent_counts, consent_html, consent_text
from lait.app.examples import EXAMPLES_PER_REASON, Example, reject_examples, run_max_unsafe, stage_settings
from lait.app.funnel import DERIVED, IMAGES, FunnelRow, funnel, reason_unit
from lait.app.pagecopies import write_page_copies
from lait.app.plots import THRESHOLD_COLOR, Threshold, plots, score_histogram_svg
from lait.build.documents import FOLDER as DOCUMENTS
from lait.build.shards import shard_files
from lait.filters.unsafe import DEFAULT_MAX_UNSAFE
from lait.reasons import REASONS
from lait.storage import Location
from lait.urls import is_http_url
from lait.workdir import WorkDir

log = logging.getLogger(__name__)

GRID_SAMPLES = 24
EXTREMES = 8
THUMB = 192
STAGE_ORDER = ("crawl", "ingest", "filter", "clean", "score", "build", "documents")
SHOWN_DOCUMENTS, SHOWN_SENTENCES = 3, 14


@dataclass
class DatasetStats:
    """Everything the report shows, gathered from the work directory's tables and shards."""

    root: str
    funnel: list[FunnelRow] = field(default_factory=list)
    rejects: Counter = field(default_factory=Counter)
    reject_units: dict[str, str] = field(default_factory=dict)  # reason -> what one of its rows is
    examples: dict[str, list[Example]] = field(default_factory=dict)
    widths: list[int] = field(default_factory=list)
    heights: list[int] = field(default_factory=list)
    scored_scores: list[float] = field(default_factory=list)
    best_scores: list[float] = field(default_factory=list)  # each image's best text: what thresholds cut
    thresholds: list[Threshold] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)  # sidecar rows of kept samples
    shards: int = 0
    shard_bytes: int = 0
    max_unsafe: float = DEFAULT_MAX_UNSAFE  # the run's (stage 2's settings), set by `gather`
    faces: dict[str, Any] = field(default_factory=dict)  # what stage 2 found and stage 5 blurred (`face_counts`)
    documents: dict[str, Any] = field(default_factory=dict)  # WORK/documents/stats.json (`lait documents`), if any

    @property
    def kept_scores(self) -> list[float]:
        return [s["score"] for s in self.samples]

    def counter(self, what: str) -> Counter:
        if what == "domains":
            return Counter(urlsplit(s["page_url"] or s["url"]).hostname or "?" for s in self.samples)
        return Counter(s[what] or "unknown" for s in self.samples)

    def sorted_rejects(self) -> list[tuple[str, int]]:
        """Reasons in pipeline order (crawl first), the most frequent first within a stage."""
        def key(item: tuple[str, int]) -> tuple:
            stage = item[0].split("/", 1)[0]
            return (STAGE_ORDER.index(stage) if stage in STAGE_ORDER else len(STAGE_ORDER), -item[1], item[0])
        return sorted(self.rejects.items(), key=key)


def _columns(work: WorkDir, table: str, *columns: str) -> list[list[Any]]:
    """Each of `columns` of every part, in part-name order, one read per part (a column a part
    lacks, from an older version, adds nothing)."""
    out: list[list[Any]] = [[] for _ in columns]
    for f in work.part_files(table):
        pf = storage.parquet_file(f)
        present = [c for c in columns if c in pf.schema_arrow.names]
        if present:
            t = pf.read(columns=present)
            for values, c in zip(out, columns):
                if c in present:
                    values += t.column(c).to_pylist()
    return out


def _scores(work: WorkDir) -> tuple[list[float], list[float]]:
    """Every scored pair's score, and each scored image's best one (scored/ is partitioned by
    image), from one read of each partition."""
    import pyarrow as pa

    every: list[float] = []
    best: list[float] = []
    for p in work.partitions("scored"):
        t = work.read("scored", p, columns=["image_url", "score"])
        every += [float(x) for x in t.column("score").to_pylist()]
        top = pa.TableGroupBy(t, "image_url").aggregate([("score", "max")])
        best += [float(x) for x in top.column("score_max").to_pylist()]
    return every, best


def _shard_stats(work: WorkDir) -> dict[str, Any]:
    """shards/stats.json (the build's settings and counters), {} when absent or unreadable."""
    path = work.root / "shards" / "stats.json"
    try:
        data = json.loads(storage.read_text(path)) if storage.exists(path) else {}
    except (ValueError, OSError) as exc:
        log.warning("stats: cannot read %s: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def _build_settings(work: WorkDir, shard_stats: dict[str, Any]) -> dict[str, Any]:
    """The settings the shards were built with: shards/stats.json's, else _configs/build.yaml."""
    if shard_stats:
        settings = shard_stats.get("config", shard_stats)
        if isinstance(settings, dict):
            return settings
    return stage_settings(work, "build")


def thresholds(settings: dict[str, Any], kept_scores: list[float]) -> list[Threshold]:
    """Stage 5's score cuts: min_score, and where top_fraction cut (the lowest kept score)."""
    out = []
    if settings.get("min_score") is not None:
        out.append(Threshold(float(settings["min_score"]), f"min_score {float(settings['min_score']):g}"))
    fraction = settings.get("top_fraction")
    if fraction is not None and float(fraction) < 1.0 and kept_scores:
        cut = min(kept_scores)
        out.append(Threshold(cut, f"top_fraction {float(fraction):g}: lowest kept {cut:.3f}"))
    return out


def gather(work_root: str | Path, *, examples_per_reason: int = 1, thumbnails: bool = False) -> DatasetStats:
    """Read the counts, distributions, kept samples and examples of every rejection reason of a
    work directory (image bytes only for the thumbnails of examples, when asked)."""
    work = WorkDir(work_root)
    st = DatasetStats(work.url)
    st.rejects = Counter(_columns(work, "rejected", "reason")[0])
    st.examples = reject_examples(work, st.rejects, max(1, examples_per_reason), thumbnails)
    st.reject_units = {r: reason_unit(r, vars(es[0])) if es else "rows" for r, es in st.examples.items()}
    st.widths, st.heights = _columns(work, "images_ok", "width", "height")
    st.scored_scores, st.best_scores = _scores(work)
    for tar in shard_files(work):
        side = tar.with_suffix(".parquet")
        if storage.exists(side):
            rows = storage.read_table(side).to_pylist()
            st.samples += [dict(r, tar=tar.name) for r in rows if r["status"] == "success"]
        st.shards += 1
        st.shard_bytes += storage.size(tar)
    docs = storage.location(work_root) / DOCUMENTS / "stats.json"
    if storage.exists(docs):
        st.documents = json.loads(storage.read_text(docs))
    st.funnel = funnel(work, st.rejects, st.reject_units, len(st.samples) if st.shards else None,
                       st.documents.get("documents") if st.documents else None)
    shard_stats = _shard_stats(work)
    build_settings = _build_settings(work, shard_stats)
    st.thresholds = thresholds(build_settings, st.kept_scores)
    filter_settings = stage_settings(work, "filter")
    st.max_unsafe = run_max_unsafe(work, filter_settings)
    st.faces = face_counts(st.samples, build_settings, shard_stats.get("counters") or {})
    return st


DOCUMENT_RULES = ("too_few_words", "repeated_paragraphs", "near_duplicate", "no_image", "too_many_images")


def documents_text(st: DatasetStats) -> list[str]:
    """The report's lines on the interleaved documents of `lait documents`, when written."""
    d = st.documents
    if not d:
        return []
    counters = d.get("counters") or {}
    drops = ", ".join(f"{r} {int(counters.get('documents/' + r, 0)):,}" for r in DOCUMENT_RULES)
    return [f"documents: {d['documents']:,} in {d['shards']} shards of {int(counters.get('documents/in', 0)):,} "
            f"pages read; {d['images']:,} pictures ({d['images_per_document']} per document), "
            f"{d['words_per_document']} words per document, {d['images_in_several_documents']:,} pictures in "
            f"several documents", f"documents dropped: {drops}"]


def shown_documents(work_root: str | Path) -> list[dict[str, Any]]:
    """The documents the report renders: the first of WORK/documents/00000.tar, as MMC4 dicts."""
    first = storage.location(work_root) / DOCUMENTS / "00000.tar"
    if not storage.exists(first):
        return []
    with tarfile.open(fileobj=io.BytesIO(storage.read_bytes(first))) as tf:
        return [json.loads(tf.extractfile(m).read()) for m in tf.getmembers()[:SHOWN_DOCUMENTS]]


def _documents_html(st: DatasetStats, docs: list[dict[str, Any]], max_unsafe: float,
                    copies: dict[str, str] | None = None) -> str:
    """The documents section: the counts, and the first documents rendered in order, each picture
    before the sentence it was placed at (thumbnails blurred as the samples' are)."""
    if not st.documents:
        return ""
    from PIL import Image

    from lait.filters.unsafe import thumbnail_uri

    lines = "".join(f"<p>{html.escape(line)}</p>" for line in documents_text(st))
    shown = []
    for doc in docs:
        at: dict[int, list[str]] = defaultdict(list)
        for info in doc["image_info"]:
            image = Image.open(io.BytesIO(base64.b64decode(info["image_base64"])))
            uri, _ = thumbnail_uri(image, THUMB, None, max_unsafe=max_unsafe)
            at[info["matched_text_index"]].append(
                f'<img class="doc" alt="{html.escape(info["raw_url"])}" src="{uri}" '
                f'title="matched_sim {info["matched_sim"]:.3f}">')
        body = []
        for j, sentence in enumerate(doc["text_list"][:SHOWN_SENTENCES]):
            body += at.get(j, [])
            body.append(html.escape(sentence) + " ")
        more = len(doc["text_list"]) - SHOWN_SENTENCES
        tail = f" <i>... {more} more sentences</i>" if more > 0 else ""
        shown.append(f'<div class="document"><h3>{_page_link(doc["url"], copies)}</h3><p>{"".join(body)}{tail}</p></div>')
    return f"<h2>Documents</h2>{lines}{''.join(shown)}"


def face_counts(samples: list[dict[str, Any]], build_settings: dict[str, Any],
                counters: dict[str, Any]) -> dict[str, Any]:
    """Stage 5's face search, per shipped sample: the pictures searched as they were written
    (now, or reused from an earlier build's search: the shard pass's `build/faces_searched`
    and `build/faces_reused`), samples with a face and their boxes (the sidecars'
    `face_bboxes`), the faces blurred (`build/faces_blurred`), and the settings."""
    searched, reused = int(counters.get("build/faces_searched", 0)), int(counters.get("build/faces_reused", 0))
    return {"searched": searched + reused, "searched_now": searched, "reused": reused,
            "samples": len(samples), "samples_with_faces": sum(1 for s in samples if s.get("face_bboxes")),
            "faces_in_samples": sum(len(s.get("face_bboxes") or ()) for s in samples),
            "blurred": int(counters.get("build/faces_blurred", 0)),
            "blur_faces": bool(build_settings.get("blur_faces", True)),
            "face_model": build_settings.get("face_model", "mtcnn-faces"),
            "min_face_score": build_settings.get("min_face_score")}


def safety_text(st: DatasetStats) -> list[str]:
    """The report's lines on the unsafe and face gates, with this run's thresholds."""
    f = st.faces
    lines = [f"unsafe: images above max_unsafe {st.max_unsafe:g} (this run's) dropped: "
             f"{st.rejects.get('filter/unsafe', 0):,}; report thumbnails above it are blurred"]
    if f:
        score = f" at min_face_score {f['min_face_score']:g}" if f.get("min_face_score") is not None else ""
        if f["face_model"] == "none":
            lines.append("faces: not searched (built with --face-model none)")
        else:
            reused = f" ({f['reused']:,} of them searched by an earlier build)" if f.get("reused") else ""
            lines.append(f"faces ({f['face_model']}{score}, searched as each picture was written): "
                         f"{f.get('searched', 0):,} of {f.get('samples', 0):,} samples searched{reused}; "
                         f"{f['faces_in_samples']:,} faces on {f['samples_with_faces']:,} samples, "
                         + (f"{f['blurred']:,} blurred" if f["blur_faces"] else "kept sharp (--no-blur-faces)"))
    return lines


def _size(st: DatasetStats) -> str:
    """The shards' size on disk: the tar files, headers and padding included (stage 5's own
    summary counts the samples' content, which is less)."""
    return f"{st.shard_bytes / 1e6:.1f} MB of tar files on disk"


# -- terminal -------------------------------------------------------------------------------
def summary_text(st: DatasetStats) -> str:
    """The plain-text report: funnel with shares, rejection reasons with their units, shards and
    the main distributions."""
    lines = [f"lait dataset report: {st.root}", "", "funnel (one unit per row; shares of the unit's first row):"]
    width = max([len(r.label) for r in st.funnel] + [10])
    for r in st.funnel:
        lines += [f"    - {reason:<{width - 4}}  {-n:>10,}" for reason, n in r.dropped.items()]
        lines.append(f"  {r.label:<{width}}  {r.count:>10,}  {r.share()}".rstrip())
    if st.rejects:
        lines += ["", "rejected, by reason:"]
        for reason, n in st.sorted_rejects():
            lines.append(f"  {reason:<40} {n:>10,}  {st.reject_units.get(reason, 'rows')}")
    lines += ["", *consent_text(st.rejects), *safety_text(st)]
    lines += ["", f"shards: {st.shards} tars, {len(st.samples):,} samples, {_size(st)}", *documents_text(st)]
    if st.samples:
        ks = sorted(st.kept_scores)
        lines.append(f"kept scores: min {ks[0]:.3f}  median {ks[len(ks) // 2]:.3f}  max {ks[-1]:.3f}")
        if st.thresholds:
            lines.append("thresholds: " + ", ".join(t.label for t in st.thresholds))
        for what in ("lang", "source"):
            top = ", ".join(f"{k} {v}" for k, v in st.counter(what).most_common(6))
            lines.append(f"{what}: {top}")
    return "\n".join(lines)


# -- samples --------------------------------------------------------------------------------
def thumbnails(shard_dir: Location, keys_by_tar: dict[str, set[str]], punsafe: dict[str, float] | None = None,
               blurred: set[str] | None = None, max_unsafe: float = DEFAULT_MAX_UNSAFE) -> dict[str, str]:
    """key -> JPEG data URI of a small thumbnail, read from the tars that hold the keys.

    A sample whose `punsafe` (from its sidecar row) is above `max_unsafe` (the run's), or
    unknown and scored so here, gets a blurred thumbnail; its key is added to `blurred`."""
    from PIL import Image

    from lait.filters.unsafe import MODEL_SIDE, thumbnail_uri

    punsafe = punsafe or {}

    out = {}
    for tar_name, keys in sorted(keys_by_tar.items()):
        with storage.open_input(shard_dir / tar_name) as f, tarfile.open(fileobj=f) as tf:
            for m in tf:
                key, _, ext = m.name.partition(".")
                if ext not in ("jpg", "png", "webp") or key not in keys:  # encode_format's
                    continue
                try:
                    with Image.open(tf.extractfile(m)) as im:
                        im.draft("RGB", (MODEL_SIDE, MODEL_SIDE))
                        out[key], blur = thumbnail_uri(im.convert("RGB"), THUMB, punsafe.get(key),
                                                       max_unsafe=max_unsafe)
                    if blur and blurred is not None:
                        blurred.add(key)
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
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:18px 0 4px}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 10px;text-align:left;vertical-align:top}
td.n,td.pct{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.first td{border-top:1px solid #ddd}td.meaning{color:#555;max-width:560px}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plot img{max-width:620px;border:1px solid #eee}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:10px}
figure.sample{margin:0;border:1px solid #ddd;padding:4px;font-size:12px;background:#fafafa}
figure.sample img{width:100%;height:160px;object-fit:contain;background:#fff}
.examples{display:flex;flex-wrap:wrap;gap:8px}
figure.example{margin:0;border:1px solid #e3c4c4;padding:4px;font-size:12px;background:#fdf8f8;width:180px;
 overflow-wrap:anywhere}
figure.example img{width:100%;height:120px;object-fit:contain;background:#fff}
figure.example blockquote{margin:0 0 4px;font-style:italic}
.score{color:#666}pre{background:#f4f4f4;padding:8px;font-size:12px}.threshold{color:""" + THRESHOLD_COLOR + """}
#score-histogram svg{max-width:760px;height:auto}
tr.drop td{color:#8a3b3b;font-size:12px}.noimage{color:#8a3b3b;font-style:italic;margin-bottom:4px}
.document{border:1px solid #ddd;padding:4px 10px;margin:8px 0;font-size:13px;max-width:900px}
img.doc{display:block;max-height:160px;max-width:240px;margin:6px 0}
"""


def _shown(url: str) -> str:
    parts = urlsplit(url)
    return (parts.netloc + (parts.path if len(parts.path) <= 48 else parts.path[:45] + "...")) or url


def _page_link(url: str | None, copies: dict[str, str] | None = None) -> str:
    """A link to the page a row came from, shown as its host and path. With `copies` (page URL
    -> stored copy beside the report, what `write_report` passes) the link opens the stored
    copy, and a page without one is shown as text: the web it came from may be gone (the
    demo's stops with it). A URL that is not http(s) (`javascript:` from an old table, say)
    is shown as text, never as a link."""
    if not url:
        return "no page"
    if not is_http_url(url):
        return f'<span class="page">{html.escape(url[:200])}</span>'
    if copies is None:
        return f'<a class="page" href="{html.escape(url)}" title="{html.escape(url)}">{html.escape(_shown(url))}</a>'
    if url in copies:
        return (f'<a class="page" href="{html.escape(copies[url])}" data-url="{html.escape(url)}" '
                f'title="stored copy of {html.escape(url)}">{html.escape(_shown(url))}</a>')
    return (f'<span class="page" data-url="{html.escape(url)}" title="{html.escape(url)} (no stored copy)">'
            f"{html.escape(_shown(url))}</span>")


def _figure(s: dict, thumbs: dict[str, str], copies: dict[str, str] | None = None,
            blurred: set[str] | frozenset = frozenset()) -> str:
    src = thumbs.get(s["key"], "")
    facts = [f"score {s['score']:.3f}", html.escape(s.get("source") or ""),
             _page_link(s.get("page_url") or s["url"], copies)]
    blur = ' data-blurred="unsafe"' if s["key"] in blurred else ""
    if blur:
        facts.append("blurred: punsafe above the threshold, or unchecked")
    return (f'<figure class="sample"><img alt="sample {html.escape(s["key"])}" src="{src}"{blur}>'
            f'<figcaption>{html.escape(s["caption"])}<br><span class="score">'
            f'{" · ".join(f for f in facts if f)}</span></figcaption></figure>')


def _detail(e: Example) -> str:
    """The rule's detail, less the page's own URL where the detail repeats it (the card names
    the page already)."""
    detail = e.detail or ""
    if e.page_url and e.image_url is None and e.text is None:
        detail = detail.replace(f": {e.page_url}", "").replace(e.page_url, "this page")
    return html.escape(detail)


def _example(e: Example, copies: dict[str, str] | None = None) -> str:
    blur = ' data-blurred="unsafe"' if e.blurred else ""
    shown = (f'<img alt="{html.escape(e.image_url or "")}" src="{e.thumb}"{blur}>' if e.thumb else "")
    if e.thumb and e.blurred:
        shown += '<div class="noimage">blurred: unsafe, or no model could check it</div>'
    if not e.thumb and e.image_url:
        note = e.image_note or "no thumbnail: the image's bytes are not stored"
        shown += f'<div class="noimage">{html.escape(note)}</div>'
    if e.text is not None:
        shown += f"<blockquote>{html.escape(e.text)}</blockquote>"
    if e.image_url is None and e.text is None:  # a page-level rule: the page first, then why
        return (f'<figure class="example"><figcaption>page {_page_link(e.page_url, copies)}<br>{_detail(e)}'
                "</figcaption></figure>")
    return (f'<figure class="example">{shown}<figcaption>{_detail(e)}<br>on {_page_link(e.page_url, copies)}'
            "</figcaption></figure>")


def _units(unit: str, n: int) -> str:
    """`1 image`, `2 images`: the unit names are plurals."""
    return unit[:-1] if n == 1 and unit.endswith("s") else unit


def _anchor(reason: str) -> str:
    return "reason-" + reason.replace("/", "-")


def _funnel_html(st: DatasetStats) -> str:
    rows, unit = [], None
    for r in st.funnel:
        first = r.unit != unit
        unit = r.unit
        pct = "" if r.percent is None else f"{r.percent:.1f}%"
        of = f' title="of {html.escape(r.base_label)}"' if r.base_label else ""
        # what was dropped on the way to this row comes before it, so the column adds up downwards
        rows += [f'<tr class="drop" data-drop="{html.escape(reason)}"><td></td><td>dropped: {_reason_ref(reason)}</td>'
                 f'<td class=n>&minus;{n:,}</td><td></td><td class=meaning>{html.escape(_drop_meaning(reason))}</td></tr>'
                 for reason, n in r.dropped.items()]
        rows.append(f'<tr class="{"first" if first else "step"}" data-unit="{html.escape(r.unit)}">'
                    f'<td>{html.escape(r.unit) if first else ""}</td><td>{html.escape(r.step)}</td>'
                    f'<td class=n>{r.count:,}</td><td class=pct{of}>{pct}</td>'
                    f'<td class=meaning>{html.escape(r.meaning)}'
                    f'{f" (share of {html.escape(r.base_label)})" if r.base_label and not first else ""}</td></tr>')
    return ('<table id="funnel"><tr><th>unit</th><th>step</th><th>count</th><th>share</th><th>what it counts</th>'
            "</tr>" + "".join(rows) + "</table>")


def _drop_meaning(reason: str) -> str:
    return DERIVED.get(reason) or REASONS.get(reason, "")


def _reason_ref(reason: str) -> str:
    """A reason, linked to its examples; a derived drop as its name."""
    if reason in DERIVED:
        return f"<i>{html.escape(reason)}</i>"
    return f'<a href="#{_anchor(reason)}">{html.escape(reason)}</a>'


def _rejects_html(st: DatasetStats, copies: dict[str, str] | None = None) -> str:
    table = "".join(f'<tr data-reason="{html.escape(k)}"><td><a href="#{_anchor(k)}">{html.escape(k)}</a></td>'
                    f"<td class=n>{n:,}</td><td>{html.escape(st.reject_units.get(k, 'rows'))}</td>"
                    f"<td class=meaning>{html.escape(REASONS.get(k, ''))}</td></tr>"
                    for k, n in st.sorted_rejects())
    sections = "".join(
        f'<section class="reason" id="{_anchor(k)}" data-reason="{html.escape(k)}">'
        f"<h3>{html.escape(k)} · {n:,} {html.escape(_units(st.reject_units.get(k, 'rows'), n))}</h3>"
        f'<div class="examples">{"".join(_example(e, copies) for e in st.examples.get(k, []))}</div></section>'
        for k, n in st.sorted_rejects())
    return (f'<table id="rejects"><tr><th>reason</th><th>rows</th><th>a row is</th><th>meaning</th></tr>{table}'
            f"</table><h3>Examples of what each reason dropped</h3>{sections}")


def _scores_html(st: DatasetStats) -> str:
    svg = score_histogram_svg({"all scored pairs": st.scored_scores, "best text per image": st.best_scores,
                               "kept captions": st.kept_scores}, st.thresholds)
    if svg is None:
        return "<p>No scores yet (stage 4 has not run).</p>"
    if st.thresholds:
        note = ("Dashed red line: stage 5's score threshold, compared with each image's best text: "
                + ", ".join(f'<span class="threshold">{html.escape(t.label)}</span>' for t in st.thresholds) + ".")
    else:
        note = "No score threshold is set (build: min_score unset, top_fraction 1.0): no image was dropped for its score."
        steps = {r.step: r for r in st.funnel if r.unit == IMAGES}
        if "in shards" in steps and steps["in shards"].dropped:
            dropped = steps["in shards"].dropped
            note += (f" {sum(dropped.values()):,} of the {steps['with scored texts'].count:,} images with a scored "
                     "text were dropped by stage 5's other rules: "
                     + ", ".join(f"{html.escape(r)} {n:,}" for r, n in dropped.items()) + ".")
    return f'<div id="score-histogram">{svg}</div><p class="note">{note}</p>'


def render_html(st: DatasetStats, plot_uris: list[tuple[str, str]], thumbs: dict[str, str],
                copies: dict[str, str] | None = None, blurred: set[str] | frozenset = frozenset(),
                documents: str = "") -> str:
    """The report page; `copies` maps page URLs to their stored copies beside it (see
    `_page_link`); the samples in `blurred` are marked as such."""
    grid, best, worst = _picked(st)
    figs = "".join(f'<div class="plot"><img alt="{html.escape(t)}" src="{u}"></div>' for t, u in plot_uris)

    def section(title: str, items: list[dict], cls: str) -> str:
        if not items:
            return ""
        return (f'<h2>{title}</h2><div class="grid {cls}">' + "".join(_figure(s, thumbs, copies, blurred) for s in items) + "</div>")

    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>lait dataset report</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style>{CSS}</style></head>
<body>
<h1>lait dataset report</h1>
<p>{html.escape(st.root)} · {st.shards} shards · {len(st.samples):,} samples · {_size(st)}</p>
<h2>Funnel</h2>
<p>Each row counts one unit, and a unit's counts only go down; the share is of the unit's first row.
An image shown on three pages is one image but three image-page pairs. Between two steps, the rows
dropped there, by reason: each step's count is the next step's plus those (a reason in italics is
no rejection rule but follows from the tables).</p>
{_funnel_html(st)}
<h2>Rejected, by reason</h2>
<p>Every row a stage dropped, by the rule that dropped it; the count is of the unit in the third
column. Below, a few examples of each: what to look at when tuning a rule.</p>
{_rejects_html(st, copies)}
<h2>Consent and safety</h2>
<p>What each gate kept out of the dataset: the owners' opt-outs (robots.txt, TDMRep, noai, a
reservation inside the image file), the operator's block lists, the safety filters. Every gate
is listed, those that removed nothing too.</p>
{consent_html(st.rejects, _anchor)}
<h2>Scores</h2>
{_scores_html(st)}
<h2>Distributions</h2><div class="plots" id="plots">{figs}</div>
{section("Samples", grid, "samples")}
{section("Best pairs", best, "best")}
{section("Worst kept pairs", worst, "worst")}
{documents}
<h2>Summary</h2><pre>{html.escape(summary_text(st))}</pre>
</body></html>
"""


def write_report(work_root: str | Path, out: str | Path | None = None) -> tuple[DatasetStats, Path | None]:
    """Gather the stats and write the HTML page to `out` (when given); returns both."""
    if out is None:
        return gather(work_root), None
    st = gather(work_root, examples_per_reason=EXAMPLES_PER_REASON, thumbnails=True)
    grid, best, worst = _picked(st)
    wanted: dict[str, set[str]] = defaultdict(set)
    for s in grid + best + worst:
        wanted[s["tar"]].add(s["key"])
    blurred: set[str] = set()
    thumbs = thumbnails(storage.location(work_root) / "shards", wanted,
                        {s["key"]: s.get("punsafe") for s in grid + best + worst}, blurred, st.max_unsafe)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    linked = {s.get("page_url") or s["url"] for s in grid + best + worst}
    linked |= {e.page_url for es in st.examples.values() for e in es if e.page_url}
    docs = shown_documents(work_root) if st.documents else []
    linked |= {d["url"] for d in docs}
    copies = write_page_copies(work_root, {u for u in linked if is_http_url(u)}, out.parent / f"{out.stem}_pages")
    page = render_html(st, plots(st.funnel, st.sorted_rejects(), st.widths, st.heights, st.samples, st.counter),
                       thumbs, copies, blurred, _documents_html(st, docs, st.max_unsafe, copies))
    out.write_text(page, encoding="utf-8")
    return st, out


def stats_json(st: DatasetStats) -> str:
    return json.dumps({"funnel": [r.to_json() for r in st.funnel],
                       "rejects": {r: {"rows": n, "unit": st.reject_units.get(r)} for r, n in st.sorted_rejects()},
                       "consent_and_safety": consent_counts(st.rejects),
                       "max_unsafe": st.max_unsafe, "faces": st.faces,
                       "thresholds": [{"value": t.value, "label": t.label} for t in st.thresholds],
                       "samples": len(st.samples), "shards": st.shards,
                       "documents": {k: v for k, v in st.documents.items() if k != "examples"} or None}, indent=1)
