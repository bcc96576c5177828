"""Issue 63: interleaved documents (`lait documents`) beside the pairs.

The pure parts first: the one-to-one assignment against a brute-force optimum, the MinHash
near-duplicate index, the document rules. Then one local web of real pages' texts and real COCO
photos, served by the test kit's server, crawled by the spider, run through stages 2-5 by
`lait run` and then `lait documents`, as a user runs them. Its pages hold what the consent
and safety rules are about: a page that reserves text and data mining, a picture served with
`X-Robots-Tag: noai`, a picture stage 2's unsafe model scores above `max_unsafe` (set between
benign photos' scores, as tests/filters/test_unsafe.py does: no unsafe image is used), and a
photo with faces. Each must behave in the documents as in the pair shards."""

from __future__ import annotations

import base64
import io
import itertools
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from lait.build.documents import NearDuplicates, assign, minhash, repeated_share, words_of

# -- the assignment ----------------------------------------------------------------------------


def _best(sims: np.ndarray) -> float:
    n, m = sims.shape
    if n <= m:
        return max(sum(sims[i, p[i]] for i in range(n)) for p in itertools.permutations(range(m), n))
    return max(sum(sims[p[j], j] for j in range(m)) for p in itertools.permutations(range(n), m))


def test_the_assignment_is_the_brute_force_optimum():
    rng = np.random.default_rng(7)
    for _ in range(400):
        n, m = (int(x) for x in rng.integers(1, 7, 2))
        sims = rng.normal(size=(n, m))
        if rng.random() < 0.3:  # ties, as cosines rounded to fp16 give
            sims = np.round(sims, 1)
        chosen = assign(sims)
        assert len(chosen) == min(n, m)
        assert len(set(chosen.values())) == len(chosen), "a sentence holds two pictures"
        assert all(0 <= i < n and 0 <= j < m for i, j in chosen.items())
        assert sum(sims[i, j] for i, j in chosen.items()) == pytest.approx(_best(sims), abs=1e-9)


def test_the_assignment_is_not_each_pictures_best_sentence():
    # Both pictures like sentence 0 best; MMC4's matching gives it to the one that gains most.
    sims = np.array([[0.9, 0.1], [0.8, 0.7]])
    assert assign(sims) == {0: 0, 1: 1}
    assert assign(np.zeros((0, 3))) == {}


def test_near_duplicates_by_minhash():
    text = ("the river rose in the night and the town woke to water in every street of the old quarter "
            "where the bakers had their ovens since the war").split()
    index = NearDuplicates(0.8)
    assert index.seen("a", minhash(text)) is None
    hit = index.seen("b", minhash(text[:-1] + ["peace"]))  # one word of 27 changed
    assert hit is not None and hit[0] == "a" and hit[1] >= 0.8
    other = "a quiet morning on the hills with sheep and a farmer counting them before the rain came down".split()
    assert index.seen("c", minhash(other)) is None
    assert NearDuplicates(1.0).seen("x", minhash(text)) is None


def test_repeated_paragraphs_and_words():
    assert repeated_share([["A b."], ["a  B."], ["c"]]) == pytest.approx(2 / 3)
    assert repeated_share([["one"], ["two"]]) == 0.0
    assert words_of([["Two words."], ["And three more"]]) == ["two", "words", "and", "three", "more"]


# -- the local web -----------------------------------------------------------------------------

FACES = "000000084533"  # a COCO photo with faces (tests/filters/test_faces.py)
COCO = ["000000030752", "000000054718", "000000063217", "000000069468", "000000070133", "000000072258",
        "000000078499", "000000084284", "000000089232", "000000100667", "000000107438", "000000113488"]
ROLES = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "noai"]  # the pictures the site serves, by role


def _paragraphs(shared_data: Path, n_pages: int) -> list[list[str]]:
    """Three long paragraphs of each of `n_pages` real articles (readability's expected texts)."""
    from lxml import html as lxml_html

    out = []
    for d in sorted((shared_data / "html" / "readability").iterdir()):
        if not (d / "expected.html").exists():
            continue
        tree = lxml_html.fromstring((d / "expected.html").read_bytes())
        paras = [" ".join(p.text_content().split()) for p in tree.iter("p")]
        paras = [p for p in paras if len(p.split()) >= 30 and p.isascii()]
        if len(paras) >= 3:
            out.append(paras[:3])
        if len(out) == n_pages:
            return out
    pytest.skip("../shared/data/html/readability has too few pages")


FIGURE_CC = "https://creativecommons.org/licenses/by-sa/2.0/"  # p3's figure's own licence
FILE_RIGHTS = "(c) 2019 Jane Doe, all rights reserved"  # what p4's file declares (XMP dc:rights)


def with_xmp_rights(jpeg: bytes, rights: str) -> bytes:
    """The JPEG with an XMP packet declaring `rights` (dc:rights) inserted after its start
    marker, as a camera or an editor writes one: the pixels are the same bytes."""
    packet = ('<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
              '<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:rights><rdf:Alt>'
              f'<rdf:li xml:lang="x-default">{rights}</rdf:li></rdf:Alt></dc:rights></rdf:Description>'
              '</rdf:RDF></x:xmpmeta>').encode()
    body = b"http://ns.adobe.com/xap/1.0/\x00" + packet
    assert jpeg[:2] == b"\xff\xd8"
    return jpeg[:2] + b"\xff\xe1" + (len(body) + 2).to_bytes(2, "big") + body + jpeg[2:]


class DocumentsWeb:
    """Four articles and a reserved page; each article: a headline, three real paragraphs, two
    figures with a caption between them."""

    def __init__(self, texts: list[list[str]], photos: dict[str, bytes]):
        from lait.testkit.generator import Response

        self.Response = Response
        self.photos = photos
        self.pages = {
            "/a/0.html": (texts[0], ["face", "p0"], {}),
            "/a/1.html": (texts[1], ["noai", "p1"], {}),
            "/a/2.html": (texts[2], ["unsafe", "p2"], {}),
            "/a/3.html": (texts[3], ["p3", "p4"], {}),
            "/reserved.html": (texts[4], ["p5", "p6"], {"tdm-reservation": "1"}),
        }

    def route(self, path: str, base_url: str = ""):
        html = "text/html; charset=utf-8"
        if path == "/":
            links = "".join(f"<li><a href='{p}'>{p}</a></li>" for p in self.pages)
            return self.Response(200, html, f"<html><body><ul>{links}</ul></body></html>".encode())
        if path in self.pages:
            paras, photos, headers = self.pages[path]
            # p3's figure declares a licence of its own (a rel="license" link), as a page can.
            figs = [f"<figure><img src='/img/{name}.jpg' alt='A photograph for {path}, number {k}' width='640'>"
                    f"<figcaption>Photo {k} of the story at {path}"
                    + (f" <a rel='license' href='{FIGURE_CC}'>licence</a>" if name == "p3" else "")
                    + "</figcaption></figure>"
                    for k, name in enumerate(photos)]
            body = (f"<article><h1>Story {path}</h1><p>{paras[0]}</p>{figs[0]}<p>{paras[1]}</p>{figs[1]}"
                    f"<p>{paras[2]}</p></article>")
            page = (f"<html lang='en'><head><title>Story {path}</title><meta name='license' content='CC BY 4.0'>"
                    f"</head><body><header><a href='/'>Home</a></header>{body}<footer>Footer</footer></body></html>")
            return self.Response(200, html, page.encode(), dict(headers))
        if path.startswith("/img/") and path[5:-4] in self.photos:
            name = path[5:-4]
            headers = {"X-Robots-Tag": "noai"} if name == "noai" else {}
            return self.Response(200, "image/jpeg", self.photos[name], headers)
        return self.Response(404, "text/plain", b"not found")


@pytest.fixture(scope="module")
def documents_web(shared_data, tmp_path_factory):
    """(work directory, lait documents' output folder, the site, max_unsafe) of the local web
    above after `lait run` and `lait documents`."""
    pytest.importorskip("lait.crawler.run")
    pytest.importorskip("facenet_pytorch", reason="the face detector's package is not installed")
    from kit import scoring_data as testdata
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.filters.unsafe import UnsafeScorer, decode_for_model
    from lait.testkit.server import SiteServer

    coco = shared_data / "photos" / "coco_train"
    if not all((coco / f"{n}.jpg").exists() for n in [FACES, *COCO]):
        pytest.skip("../shared/data/photos/coco_train is absent")
    # The "unsafe" picture: the benign photo open_nsfw scores highest, with max_unsafe set
    # between it and every other photo served; scored by the float model, which stage 2 runs near
    # max_unsafe and above (max_unsafe 0 asks it for every photo).
    scorer = UnsafeScorer(max_unsafe=0.0)
    data = {n: (coco / f"{n}.jpg").read_bytes() for n in [FACES, *COCO]}
    scores = {n: scorer(decode_for_model(b)) for n, b in data.items()}
    ranked = sorted(COCO, key=lambda n: -scores[n])
    photos = {"face": data[FACES], "unsafe": data[ranked[0]], **{r: data[n] for r, n in zip(ROLES, ranked[1:])}}
    rest = max(scores[n] for n in [FACES, *ranked[1:len(ROLES) + 1]])
    assert scores[ranked[0]] > rest, "two photos with one score: pick others"
    max_unsafe = (scores[ranked[0]] + rest) / 2
    photos["p4"] = with_xmp_rights(photos["p4"], FILE_RIGHTS)
    site = DocumentsWeb(_paragraphs(shared_data, 5), photos)

    root = tmp_path_factory.mktemp("documents")
    work = root / "work"
    with SiteServer(site) as srv:
        crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(work), allow_loopback=True, autothrottle=False,
                          log_level="WARNING", n_partitions=2), timeout=300, quiet=True)
    config = root / "pipeline.yaml"
    config.write_text(json.dumps({
        "filter": {"max_unsafe": max_unsafe},
        "score": {"model_config": str(testdata.tiny_config_file(root)), "allow_random_init": True,
                  "loader_workers": 0, "near_dup_threshold": 0.9999},
        "build": {"samples_per_shard": 50, "use_embedding_dups": False, "phash_threshold": -1},
    }))
    run = [sys.executable, "-m", "lait"]
    done = subprocess.run([*run, "run", str(work), "--config", str(config), "--workers", "1", "--no-progress"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    # A tiny random scorer's cosines say nothing: every picture stays (--min-sim -1).
    done = subprocess.run([*run, "documents", str(work), "--workers", "1", "--no-progress", "--min-sim", "-1",
                           "--min-words", "40"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "documents: 4 written" in done.stderr, done.stderr[-2000:]
    return work, work / "documents", site, max_unsafe


def _pair_samples(work: Path) -> list[tuple[dict, bytes]]:
    out = []
    for tar in sorted((work / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            members = {m.name: tf.extractfile(m).read() for m in tf.getmembers()}
        out += [(json.loads(data), members[name[:-5] + ".jpg"]) for name, data in members.items()
                if name.endswith(".json")]
    return out


def _documents(folder: Path) -> list[dict]:
    """The MMC4 documents, read as MMC4's published format describes a document (one JSON per
    document: `url`, `text_list`, `image_info` [{`image_name`, `raw_url`, `matched_text_index`,
    `matched_sim`}], `similarity_matrix`) and OpenFlamingo's tars carry it (`image_base64`)."""
    docs = []
    for tar in sorted(folder.glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                assert m.name.endswith(".json"), m.name
                docs.append(json.loads(tf.extractfile(m).read()))
    return docs


def _mmc4_loader(doc: dict) -> tuple[list[str], list[tuple[int, object]]]:
    """Sentences and (sentence index, decoded picture) pairs, as an MMC4 loader reads them: each
    image goes before the sentence `matched_text_index` names, and the matrix has one row per
    image and one column per sentence."""
    from PIL import Image

    sentences = doc["text_list"]
    matrix = doc["similarity_matrix"]
    assert len(matrix) == len(doc["image_info"]) and all(len(r) == len(sentences) for r in matrix)
    out = []
    for k, info in enumerate(doc["image_info"]):
        j = info["matched_text_index"]
        assert 0 <= j < len(sentences)
        assert info["matched_sim"] == pytest.approx(matrix[k][j], abs=1e-5)
        image = Image.open(io.BytesIO(base64.b64decode(info["image_base64"])))
        image.load()
        out.append((j, image.convert("RGB")))
    return sentences, out


def test_documents_read_as_mmc4_and_through_webdataset(documents_web):
    wds = pytest.importorskip("webdataset")
    work, folder, site, _ = documents_web
    docs = _documents(folder)
    assert len(docs) == 4
    for doc in docs:
        sentences, placed = _mmc4_loader(doc)
        assert placed and len({j for j, _ in placed}) == len(placed), "a sentence holds two pictures"
        assert doc["uid"] and doc["license"] == "CC BY 4.0" and doc["lang"] == "en"
        assert len(" ".join(sentences).split()) >= 40
    seen = 0
    for sample in wds.WebDataset([str(p) for p in sorted(folder.glob("*.tar"))], shardshuffle=False):
        doc = json.loads(sample["json"])
        assert set(doc) >= {"url", "text_list", "image_info", "similarity_matrix"}
        seen += 1
    assert seen == 4
    stats = json.loads((folder / "stats.json").read_text())
    assert stats["documents"] == 4 and stats["images"] == sum(len(d["image_info"]) for d in docs)


def test_obelics_parquet_loads_in_hf_datasets_with_typed_columns(documents_web, tmp_path):
    datasets = pytest.importorskip("datasets")
    from lait.workdir import WorkDir

    work, folder, _, _ = documents_web
    after = {(d["page_url"], u): im["after"] for d in WorkDir(work).read("doc_pages").to_pylist()
             for im in d["images"] for u in im["urls"]}
    ds = datasets.load_dataset("parquet", data_files=sorted(str(p) for p in folder.glob("*.parquet")),
                               split="train", cache_dir=str(tmp_path / "hf"))
    assert len(ds) == 4
    assert ds.features["texts"].feature.dtype == "string" and ds.features["images"].feature.dtype == "string"
    assert ds.features["image_bytes"].feature.dtype == "binary"
    docs = {d["url"]: d for d in _documents(folder)}
    for row in ds:
        assert len(row["texts"]) == len(row["images"]) == len(row["image_bytes"])
        for text, image in zip(row["texts"], row["images"]):
            assert (text is None) != (image is None), "each slot holds a text or a picture"
        # DOM order: each picture after as many paragraphs as the page has before it (on these
        # pages the first figure follows the headline and the first paragraph).
        for k, url in enumerate(row["images"]):
            if url is not None:
                assert sum(1 for t in row["texts"][:k] if t is not None) == after[row["url"], url]
        assert min(after[row["url"], u] for u in row["images"] if u) >= 2
        assert [u for u in row["images"] if u] == [i["raw_url"] for i in docs[row["url"]]["image_info"]]
        general = json.loads(row["general_metadata"])
        assert general["url"] == row["url"] and general["license"] == "CC BY 4.0"


def test_every_matched_sim_is_the_stage4_cosine(documents_web):
    from lait.app.steps import recorded_settings
    from lait.arrays import stack_embs
    from lait.scoring.config import ScoreConfig
    from lait.scoring.model import load_scorer
    from lait.workdir import WorkDir

    work, folder, _, _ = documents_web
    wd = WorkDir(work)
    embs = wd.read("image_embs")
    image = dict(zip(embs.column("image_url").to_pylist(), stack_embs(embs).astype(np.float32)))
    cfg = ScoreConfig.from_dict({**recorded_settings(str(work), "score", ScoreConfig)[0], "work": str(work)})
    scorer = load_scorer(cfg)
    scored = {(r["image_url"], r["text"]): r["score"] for r in wd.read("scored").to_pylist()}
    same_text = 0
    for doc in _documents(folder):
        texts = scorer.encode_texts(doc["text_list"])
        for k, info in enumerate(doc["image_info"]):
            cos = image[info["raw_url"]] @ texts.T
            assert np.allclose(doc["similarity_matrix"][k], cos, atol=2e-3)
            j = info["matched_text_index"]
            assert info["matched_sim"] == pytest.approx(float(cos[j]), abs=2e-3)
            for jj, sentence in enumerate(doc["text_list"]):  # a sentence stage 4 scored as a caption
                if (info["raw_url"], sentence) in scored:
                    same_text += 1
                    assert doc["similarity_matrix"][k][jj] == pytest.approx(scored[info["raw_url"], sentence], abs=2e-3)
    assert same_text, "no sentence of a document was also one of its pictures' candidates"


def test_a_reserved_page_gives_no_pair_and_no_document(documents_web):
    from lait.workdir import WorkDir

    work, folder, _, _ = documents_web
    urls = {d["url"].split("/", 3)[3] for d in _documents(folder)}
    assert urls == {"a/0.html", "a/1.html", "a/2.html", "a/3.html"}
    assert not [s for s, _ in _pair_samples(work) if s["page_url"].endswith("/reserved.html")]
    pages = WorkDir(work).read("pages", columns=["url", "error"]).to_pylist()
    assert [p["error"] for p in pages if p["url"].endswith("/reserved.html")] == ["tdm_reserved"]


def test_a_noai_picture_is_in_no_pair_and_no_document(documents_web):
    work, folder, _, _ = documents_web
    shipped = {s["url"] for s, _ in _pair_samples(work)} | {i["raw_url"] for d in _documents(folder)
                                                            for i in d["image_info"]}
    assert not [u for u in shipped if u.endswith("/img/noai.jpg")]
    assert any(u.endswith("/img/p1.jpg") for u in shipped)  # its page's other photo ships


def test_an_unsafe_picture_is_in_no_pair_and_no_document(documents_web):
    from lait.workdir import WorkDir

    work, folder, _, max_unsafe = documents_web
    rejected = WorkDir(work).read("rejected", columns=["reason", "image_url"]).to_pylist()
    assert [r["image_url"].rsplit("/", 1)[1] for r in rejected if r["reason"] == "filter/unsafe"] == ["unsafe.jpg"]
    docs = _documents(folder)
    shipped = {s["url"] for s, _ in _pair_samples(work)} | {i["raw_url"] for d in docs for i in d["image_info"]}
    assert not [u for u in shipped if u.endswith("/img/unsafe.jpg")]
    page = next(d for d in docs if d["url"].endswith("/a/2.html"))
    assert [i["raw_url"].rsplit("/", 1)[1] for i in page["image_info"]] == ["p2.jpg"]


def test_each_pictures_own_licence_is_in_documents_as_in_pairs(documents_web):
    """A figure's rel="license" link and a file's XMP rights reach the document's picture as
    they reach the pair sample (`image_license`, `image_license_from`), in the MMC4 JSON and in
    the OBELICS metadata; the page's licence stays the document's."""
    import pyarrow.parquet as pq

    work, folder, _, _ = documents_web
    docs = _documents(folder)
    got = {i["raw_url"].rsplit("/", 1)[1]: (i["image_license"], i["image_license_from"])
           for d in docs for i in d["image_info"]}
    assert got["p3.jpg"] == (FIGURE_CC, "figure") and got["p4.jpg"] == (FILE_RIGHTS, "file")
    assert {v for k, v in got.items() if k not in ("p3.jpg", "p4.jpg")} == {(None, None)}
    assert {d["license"] for d in docs} == {"CC BY 4.0"}
    pairs = {s["url"]: (s["image_license"] or None, s["image_license_from"] or None) for s, _ in _pair_samples(work)}
    both = [i for d in docs for i in d["image_info"] if i["raw_url"] in pairs]
    assert both, "no picture is in both a pair and a document"
    assert all((i["image_license"], i["image_license_from"]) == pairs[i["raw_url"]] for i in both)
    slots = {}
    for f in sorted(folder.glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            for url, meta in zip(row["images"], json.loads(row["metadata"])):
                if url is not None:
                    m = json.loads(meta)
                    slots[url.rsplit("/", 1)[1]] = (m["image_license"], m["image_license_from"])
    assert slots == got


def test_faces_are_blurred_in_documents_as_in_pairs(documents_web):
    from lait.build.faces import DEFAULT_MIN_FACE_SCORE, FaceFinder, decode_for_search

    work, folder, site, _ = documents_web
    pairs = {s["url"]: (s, jpg) for s, jpg in _pair_samples(work)}
    face_url = next(u for u in pairs if u.endswith("/img/face.jpg"))
    meta, shipped = pairs[face_url]
    assert meta["face_bboxes"]
    info = next(i for d in _documents(folder) for i in d["image_info"] if i["raw_url"] == face_url)
    data = base64.b64decode(info["image_base64"])
    assert data == shipped, "the document's picture is not the pair shard's"
    assert data != site.photos["face"]
    assert [f["box"] for f in info["face_detections"]] == meta["face_bboxes"]
    assert FaceFinder(min_score=DEFAULT_MIN_FACE_SCORE)(decode_for_search(data))[0] == []


def test_a_rerun_redoes_nothing_and_writes_the_same_documents(documents_web):
    work, folder, _, _ = documents_web
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".tar", ".parquet")}
    done = subprocess.run([sys.executable, "-m", "lait", "documents", str(work), "--workers", "1", "--no-progress",
                           "--min-sim", "-1", "--min-words", "40"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "clean_documents: 0 done" in done.stderr and "score_documents: 0 done" in done.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".tar", ".parquet")} == before


def test_stats_and_the_report_show_the_documents(documents_web, tmp_path):
    from lait.app.report import summary_text, write_report

    work, folder, _, _ = documents_web
    st, page = write_report(work, tmp_path / "report.html")
    rows = {r.step: r for r in st.funnel if r.unit == "documents"}
    assert rows["written"].count == 4
    # Each step adds up: the next step's count plus what was dropped there, by reason.
    assert rows["pages read"].count == rows["with main text"].count + sum(rows["with main text"].dropped.values())
    assert rows["with main text"].count == 4 + sum(rows["written"].dropped.values())
    text = summary_text(st)
    assert "documents: 4 in 1 shards" in text and "documents dropped:" in text
    html = page.read_text()
    assert html.count('class="document"') == 3 and html.count('<img class="doc"') >= 3
    first = _documents(folder)[0]
    assert first["text_list"][0] in html


def test_verify_reads_the_documents_back_and_names_a_changed_byte(documents_web, tmp_path):
    import shutil

    work, folder, _, _ = documents_web
    run = [sys.executable, "-m", "lait", "verify"]
    done = subprocess.run([*run, str(work)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 document files read back: all intact" in done.stderr, done.stderr[-2000:]
    # A copy of the folder with one byte of its tar changed (the module's other tests read the original).
    copy = tmp_path / "work"
    shutil.copytree(work, copy)
    tar = copy / "documents" / "00000.tar"
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 1
    tar.write_bytes(bytes(data))
    done = subprocess.run([*run, str(copy)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("documents/")]
    assert line.startswith("documents/00000.tar: does not match the SHA-256") and "lait documents redoes it" in line
    (copy / "documents" / "stats.json").unlink()
    done = subprocess.run([*run, str(copy)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "documents/stats.json: is missing; lait documents redoes it" in done.stderr
