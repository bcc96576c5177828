"""Real-web mode: real article pages served locally with their images made reachable.

Pages come from ``../shared/data/html`` (mozilla/readability test pages and the
article-extraction-benchmark pages). Every image URL they reference, as ``lait.pagereader``
reads them (``<img>`` src, srcset, lazy-load attributes, ``<picture>`` sources,
``og:image``/``twitter:image``), is rewritten to
``/photos/r/<hash>.jpg``: a flipped crop of a real photo from ``../shared/data/photos``,
chosen deterministically from the original URL. Each page also gets planted
``<figure><img><figcaption>`` blocks pairing a COCO photo (``/photos/coco/<file>``) with one
of its human captions: the only image-text pairs whose truth is known.

Ground truth has the generator's shape. Substituted images carry ``"substituted": true`` and
``true_caption: null``; their verdict only covers what their bytes decide
(``filter/min_side``, ``filter/aspect_ratio``). Planted photos are ``keep: true`` with every
caption they were planted with in ``true_captions``. Pages that lxml cannot parse are served
unchanged with ``"parse_ok": false``.

With hostile hosts attached (`RealWebSite.attach_hostile`, `lait.testkit.hostile`), the images
of about one original host in `HOSTILE_SHARE` keep an off-site host, as on the real web: all
images of that host go to one hostile host (picked by a hash of the original host name), and
their ground truth names the reasons of its kind. ``max_pages`` serves only the first pages.

``pages_dir`` serves another directory of real pages instead of ``../shared/data/html``: one
with an ``index.json`` listing ``{"id", "url", "site", "file"}`` (as
``bench/captions/unseen_pages.py`` writes it), each page served at ``/SITE/ID.html``. Images
and planted photos still come from ``data_dir``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from urllib.parse import urlsplit

import lxml.html
from PIL import Image, ImageOps

from lait.pagereader import Resolver, base_url, image_attributes, image_elements, parse_html, split_srcset
from lait.testkit.generator import Response

log = logging.getLogger(__name__)

HTML = "text/html; charset=utf-8"
HOSTILE_SHARE = 5  # with hostile hosts, one original image host in this many is hostile


def default_data_dir() -> Path:
    """``../shared/data`` relative to the repository root."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _path(url: str) -> str:
    """The path of an absolute URL (hostile images), or the URL itself (a local path)."""
    return "/" + url.split("/", 3)[3] if "://" in url else url


@dataclass
class RealPage:
    """One real page: where it came from and, once built, its served bytes and references."""

    path: str
    source: str  # "readability", "aeb", or "pages" (a `pages_dir`)
    file: Path
    original_url: str | None
    body: bytes = b""
    lang: str | None = None
    parse_ok: bool = True
    refs: list[dict] = field(default_factory=list)


class RealWebSite:
    """A :class:`~lait.testkit.generator.Site`-compatible site over the shared real pages."""

    name = "lait real web"

    def __init__(self, data_dir: str | Path | None = None, planted_per_page: int = 1,
                 max_pages: int | None = None, pages_dir: str | Path | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else default_data_dir()
        html_dir = self.data_dir / "html"
        if pages_dir is None and not html_dir.is_dir():
            raise FileNotFoundError(f"no real-web data at {html_dir}")
        if not (self.data_dir / "photos").is_dir():
            raise FileNotFoundError(f"no real photos at {self.data_dir / 'photos'}")
        self.planted_per_page = planted_per_page
        self._pages: dict[str, RealPage] = {}
        self._built = False
        if pages_dir is None:
            self._collect_pages(html_dir)
        else:
            self._collect_index(Path(pages_dir))
        if max_pages:
            self._pages = {p: self._pages[p] for p in sorted(self._pages)[:max_pages]}
        self.hostile = None  # lait.testkit.hostile.HostileHosts, once attached
        coco = self.data_dir / "photos" / "coco_train"
        meta = json.loads((coco / "captions.json").read_text())
        caps: dict[int, list[str]] = {}
        for ann in meta["annotations"]:
            caps.setdefault(ann["image_id"], []).append(ann["caption"].strip())
        self._coco = sorted(((im["file_name"], caps.get(im["id"], [])) for im in meta["images"]
                             if (coco / im["file_name"]).exists() and caps.get(im["id"])))
        self._photos = sorted(p for p in (self.data_dir / "photos").rglob("*.jpg"))
        self._photo_sizes = {p: Image.open(p).size for p in self._photos}
        self._substitutes: dict[str, tuple[Path, tuple[int, int, int, int]]] = {}

    # ----- pages
    def _collect_pages(self, html_dir: Path) -> None:
        for d in sorted((html_dir / "readability").glob("*/")):
            if (d / "source.html").exists():
                self._add(RealPage(f"/readability/{d.name}/", "readability", d / "source.html",
                                   None))
        aeb = html_dir / "aeb"
        truth = json.loads((aeb / "ground-truth.json").read_text()) if aeb.is_dir() else {}
        for page_id, info in sorted(truth.items()):
            file = aeb / "html" / f"{page_id}.html.gz"
            if not file.exists():
                continue
            path = urlsplit(info["url"]).path or "/"
            if path in self._pages or path in ("/", "/robots.txt", "/sitemap.xml") \
                    or path.startswith("/photos/"):
                path = f"/aeb/{page_id[:12]}{path}"  # two sites used the same path
            self._add(RealPage(path, "aeb", file, info["url"]))

    def _collect_index(self, pages_dir: Path) -> None:
        index = pages_dir / "index.json"
        if not index.is_file():
            raise FileNotFoundError(f"no index.json in {pages_dir}")
        for info in json.loads(index.read_text()):
            file = pages_dir / info["file"]
            if file.is_file():
                self._add(RealPage(f"/{info['site']}/{info['id']}.html", "pages", file, info["url"]))

    def _add(self, page: RealPage) -> None:
        self._pages[page.path] = page

    def page_paths(self) -> list[str]:
        """Every served page, sorted (the home page first)."""
        return ["/"] + sorted(self._pages)

    def _build_all(self) -> None:
        # Building assigns planted photos in a fixed page order, so build all pages at once.
        if self._built:
            return
        for k, path in enumerate(sorted(self._pages)):
            self._build(self._pages[path], k)
        self._built = True
        log.info("real web: %d pages built", len(self._pages))

    def original(self, path: str) -> tuple[bytes, str]:
        """The page served at ``path`` as its site published it, and the URL it is read at."""
        page = self._pages[path]
        raw = page.file.read_bytes()
        if page.file.suffix == ".gz":
            raw = gzip.decompress(raw)
        return raw, page.original_url or f"https://readability.example{page.path}"

    def _build(self, page: RealPage, k: int) -> None:
        raw, page_url = self.original(page.path)
        try:
            doc = parse_html(raw)  # as the crawler parses it: a stray byte does not end the page
        except Exception as exc:  # lxml raises several types on odd input
            log.warning("real web: cannot parse %s: %s", page.file, exc)
            doc = None
        if doc is None:
            page.body, page.parse_ok = raw, False
            return
        page.lang = doc.get("lang") or None
        self._rewrite_images(doc, page, page_url)
        for el in doc.xpath("//base"):
            el.drop_tree()  # a <base href> would send relative URLs off-host
        for el in doc.iter("meta"):
            if el.get("charset"):
                el.set("charset", "utf-8")  # bytes are re-encoded as UTF-8 below
            elif (el.get("http-equiv") or "").lower() == "content-type":
                el.set("content", HTML)
        self._plant(doc, page, k)
        page.body = lxml.html.tostring(doc, doctype="<!DOCTYPE html>", encoding="utf-8",
                                       method="html")

    def attach_hostile(self, hosts) -> None:
        """Put the images of some original hosts on `hosts` (a started
        `lait.testkit.hostile.HostileHosts`); call it before the first page is served."""
        if self._built:
            raise RuntimeError("attach hostile hosts before the pages are built")
        self.hostile = hosts

    def _hostile_kind(self, url: str) -> str | None:
        from lait.testkit.hostile import KINDS

        if self.hostile is None:
            return None
        n = int(hashlib.sha1((urlsplit(url).hostname or "").encode()).hexdigest()[:8], 16)
        return list(KINDS)[n // HOSTILE_SHARE % len(KINDS)] if n % HOSTILE_SHARE == 0 else None

    def _substitute(self, url: str) -> str:
        """The URL standing in for an original image URL: a local crop (registered here), or
        an image on a hostile host."""
        h = hashlib.sha1(url.encode()).hexdigest()[:16]
        kind = self._hostile_kind(url)
        if kind is not None:
            from lait.testkit.hostile import image_path

            return self.hostile.base_url(kind) + image_path(kind, h)
        local = f"/photos/r/{h}.jpg"
        if local not in self._substitutes:
            n = int(h, 16)
            photo = self._photos[n % len(self._photos)]
            w, h_ = self._photo_sizes[photo]
            fx, fy = 0.7 + (n >> 8) % 25 / 100, 0.7 + (n >> 16) % 25 / 100
            cw, ch = max(1, int(w * fx)), max(1, int(h_ * fy))
            x0, y0 = (n >> 24) % (w - cw + 1), (n >> 32) % (h_ - ch + 1)
            self._substitutes[local] = (photo, (x0, y0, x0 + cw, y0 + ch))
        return local

    def _rewrite_images(self, doc, page: RealPage, page_url: str) -> None:
        """Substitute every image URL the page reader finds, wherever it reads them from."""
        for image in image_elements(doc, page_url):
            alt = None if image.how == "og" else image.element.get("alt")
            for url in image.urls:
                page.refs.append(self._ref(_path(self._substitute(url)), image.how, alt, url))
        resolve = Resolver(base_url(doc, page_url))

        def local(raw: str) -> str:
            url = resolve(raw)
            return self._substitute(url) if url else raw

        for el in doc.iter("img", "source", "meta"):
            for attr, is_srcset in image_attributes(el):
                value = el.get(attr)
                if value and is_srcset:  # every candidate, not only the one the reader takes
                    el.set(attr, ", ".join(f"{local(u)} {d}".strip() for u, d in split_srcset(value)))
                elif value:
                    el.set(attr, local(value))

    @staticmethod
    def _ref(url: str, via: str, alt: str | None, original: str | None,
             caption: str | None = None, sources: tuple[str, ...] = ()) -> dict:
        return {"url": url, "found_via": via, "alt": alt, "true_caption": caption,
                "caption_sources": list(sources), "original_url": original}

    def _plant(self, doc, page: RealPage, k: int) -> None:
        """Insert planted COCO figures after the first substantial paragraphs of the article: a
        paragraph inside a link, a menu, a header, a footer, a sidebar or a form is the page's
        chrome, where no article photo sits (and where stage 3 reads an image's place as such,
        `lait.filters.image_place`); those come last."""
        paragraphs = [p for p in doc.iter("p") if len(p.text_content().strip()) > 80]
        chrome = ("a", "nav", "header", "footer", "aside", "form", "button")
        paragraphs.sort(key=lambda p: next(p.iterancestors(*chrome), None) is not None)
        body = doc.find("body")
        for j in range(self.planted_per_page):
            slot = k * self.planted_per_page + j
            file_name, captions = self._coco[slot % len(self._coco)]
            caption = captions[(slot // len(self._coco)) % len(captions)]
            url = f"/photos/coco/{file_name}"
            alt_is_caption = slot % 2 == 1
            alt = caption if alt_is_caption else ""
            fig = lxml.html.fragment_fromstring(
                f'<figure class="lait-planted"><img src="{url}" alt="{escape(alt)}">'
                f"<figcaption>{escape(caption)}</figcaption></figure>")
            anchor = paragraphs[j] if j < len(paragraphs) else None
            if anchor is not None and anchor.getparent() is not None:
                anchor.addnext(fig)
            elif body is not None:
                body.append(fig)
            else:
                doc.append(fig)
            sources = ("alt", "figcaption") if alt_is_caption else ("figcaption",)
            page.refs.append(self._ref(url, "img", alt, None, caption, sources))

    # ----- routing
    def route(self, path: str, base_url: str = "") -> Response:
        """Answer a GET for ``path`` (query string ignored)."""
        path = path.split("?", 1)[0].split("#", 1)[0] or "/"
        if path in ("/", "/index.html"):
            return Response(200, HTML, self._index().encode())
        if path == "/robots.txt":
            return Response(200, "text/plain; charset=utf-8",
                            f"User-agent: *\nAllow: /\n\nSitemap: {base_url}/sitemap.xml\n".encode())
        if path == "/sitemap.xml":
            locs = "".join(f"<url><loc>{base_url}{escape(p)}</loc></url>\n"
                           for p in self.page_paths())
            return Response(200, "application/xml",
                            ('<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns='
                             f'"http://www.sitemaps.org/schemas/sitemap/0.9">\n{locs}</urlset>\n'
                             ).encode())
        if path in self._pages:
            self._build_all()
            page = self._pages[path]
            return Response(200, HTML if page.parse_ok else "text/html", page.body)
        if path.startswith("/photos/coco/"):
            file = self.data_dir / "photos" / "coco_train" / path.rsplit("/", 1)[-1]
            if file.is_file() and file.suffix == ".jpg":
                return Response(200, "image/jpeg", file.read_bytes())
        if path.startswith("/photos/r/"):
            self._build_all()
            if path in self._substitutes:
                return Response(200, "image/jpeg", self._render_substitute(path))
        return Response(404, HTML, b"<!DOCTYPE html><title>404 Not Found</title><h1>Not Found</h1>")

    def _render_substitute(self, path: str) -> bytes:
        photo, box = self._substitutes[path]
        with Image.open(photo) as im:
            img = ImageOps.mirror(im.convert("RGB").crop(box))
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=88)
        return buf.getvalue()

    def _index(self) -> str:
        items = "".join(f'<li><a href="{escape(p)}">{escape(p)}</a></li>\n'
                        for p in self.page_paths()[1:])
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
                f"<title>{self.name}</title></head><body><main><h1>{self.name}</h1>"
                f"<ul>\n{items}</ul></main></body></html>\n")

    # ----- ground truth
    def ground_truth(self) -> dict:
        """Pages with their image references, and a verdict for every served image URL."""
        self._build_all()
        pages: dict[str, dict] = {"/": {"status": 200, "lang": "en", "disallowed": False,
                                        "noai": False, "images": []}}
        images: dict[str, dict] = {}
        for path in sorted(self._pages):
            page = self._pages[path]
            pages[path] = {"status": 200, "lang": page.lang, "disallowed": False, "noai": False,
                           "source": page.source, "original_url": page.original_url,
                           "parse_ok": page.parse_ok, "images": page.refs}
            for ref in page.refs:
                entry = images.get(ref["url"])
                if entry is None:
                    entry = images[ref["url"]] = self._image_truth(ref["url"])
                if ref["true_caption"] and ref["true_caption"] not in entry["true_captions"]:
                    entry["true_captions"].append(ref["true_caption"])
                    entry["true_caption"] = entry["true_caption"] or ref["true_caption"]
        return {"mode": "real-web", "data_dir": str(self.data_dir), "n_pages": len(self._pages),
                "disallowed_prefix": None, "pages": pages, "images": images,
                "junk_texts": [], "broken_links": []}

    def _image_truth(self, url: str) -> dict:
        from lait.testkit.hostile import image_truth, kind_of

        if kind_of(url) is not None:
            return image_truth(url)
        if url.startswith("/photos/coco/"):
            file = self.data_dir / "photos" / "coco_train" / url.rsplit("/", 1)[-1]
            w, h = self._photo_sizes.get(file) or Image.open(file).size
            substituted = False
        else:
            _, (x0, y0, x1, y1) = self._substitutes[url]
            w, h = x1 - x0, y1 - y0
            substituted = True
        reason = ("filter/min_side" if min(w, h) < 300
                  else "filter/aspect_ratio" if max(w, h) / min(w, h) > 3 else None)
        return {"status": 200, "width": w, "height": h, "format": "JPEG", "keep": reason is None,
                "reason": reason, "true_caption": None, "true_captions": [],
                "duplicate_of": None, "substituted": substituted}

    def write_ground_truth(self, path: str | Path) -> Path:
        """Write :meth:`ground_truth` as JSON to ``path`` and return it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.ground_truth(), ensure_ascii=False, indent=1))
        return path
