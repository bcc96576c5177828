"""Issue 19: URL lists into url_list/ and rejected/ (`lait.crawler.url_list`), without fetching."""

from __future__ import annotations

import bz2
import csv
import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lait.config import ConfigError
from lait.crawler.url_list import ListOptions, expand_lists, list_format, normalise_url, read_lists
from lait.workdir import WorkDir

ROWS = [
    {"url": "http://a.test/1.jpg", "caption": "a red bus on a street", "page": "http://a.test/p1", "nsfw": "UNLIKELY"},
    {"url": "http://b.test/2.jpg", "caption": "two dogs in the snow", "page": "", "nsfw": "UNLIKELY"},
    {"url": "", "caption": "no url at all", "page": "", "nsfw": "UNSURE"},
    {"url": "ftp://c.test/3.jpg", "caption": "an ftp photo", "page": "", "nsfw": "UNLIKELY"},
    {"url": "http://a.test/1.jpg", "caption": "the same bus again", "page": "", "nsfw": "UNLIKELY"},
    {"url": "http://d.test/4 x.jpg#frag", "caption": "", "page": "", "nsfw": "NSFW"},
]


def write_csv(path, rows, delimiter=","):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]), delimiter=delimiter)
        w.writeheader()
        w.writerows(rows)
    return path


def read(work_dir, paths, **kw):
    work = WorkDir(work_dir, n_partitions=3).init()
    reports = read_lists([str(p) for p in paths], work, ListOptions(**kw), show_progress=False)
    return work, reports


def outcome(work):
    rows = sorted(work.iter_rows("url_list"), key=lambda r: (r["list_file"], r["row"]))
    kept = [(r["image_url"], r["caption"], r["page_url"], r["row"]) for r in rows]
    rejected = sorted(((r["reason"], r["image_url"], r["detail"]) for r in work.iter_rows("rejected")),
                      key=lambda r: (r[0], r[1] or "", r[2]))
    return kept, rejected


@pytest.mark.parametrize("name", ["list.csv", "list.csv.gz", "list.tsv", "list.jsonl", "list.jsonl.bz2",
                                  "list.parquet"])
def test_every_format_gives_the_same_rows(tmp_path, name):
    path = tmp_path / name
    if ".csv" in name:
        write_csv(path, ROWS)
    elif ".tsv" in name:
        write_csv(path, ROWS, delimiter="\t")
    elif ".jsonl" in name:
        text = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
        path.write_bytes(bz2.compress(text) if name.endswith(".bz2") else text)
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    work, (report,) = read(tmp_path / "W", [path], page_col="page", extra_cols=["nsfw"])
    kept, rejected = outcome(work)
    assert kept == [("http://a.test/1.jpg", "a red bus on a street", "http://a.test/p1", 1),
                    ("http://b.test/2.jpg", "two dogs in the snow", None, 2),
                    ("http://d.test/4%20x.jpg", None, None, 6)]  # escaped as requested, no fragment
    # rejected/'s URL columns hold http(s) URLs only: the ftp URL is in the detail, as text
    assert [(r, u) for r, u, _ in rejected] == [
        ("download/bad_url", None), ("download/bad_url", None),
        ("download/duplicate_url", "http://a.test/1.jpg")]
    assert any("'ftp://c.test/3.jpg'" in d for r, _, d in rejected if r == "download/bad_url")
    dup = [d for r, _, d in rejected if r == "download/duplicate_url"][0]
    assert dup == f"{name} row 5: the URL of {name} row 1"
    assert report.rows == 6 and report.kept == 3
    extras = {r["row"]: json.loads(r["extra"]) for r in work.iter_rows("url_list")}
    assert extras == {1: {"nsfw": "UNLIKELY"}, 2: {"nsfw": "UNLIKELY"}, 6: {"nsfw": "NSFW"}}


@pytest.mark.parametrize("delimiter", [",", "\t"])
def test_csv_extra_columns_get_the_types_pyarrow_infers(tmp_path, delimiter):
    """Issue 52: `"coco_id": "139"` where img2dataset (pyarrow's CSV reader) writes 139. Types are
    pyarrow's, inferred from the first block; a later value that does not fit stays text, a
    null marker is null, and the caption stays text even when it looks like a number."""
    from pyarrow import csv as pacsv

    rows = [{"url": f"http://a.test/{i}.jpg", "caption": "2019" if i == 1 else f"photo {i}", "id": str(100 + i),
             "w": ["0.5", "1", "2.25"][i % 3], "ok": ["true", "False"][i % 2], "tag": f"t{i}",
             "none": "", "mix": ["1", "2", "x"][i % 3]} for i in range(6)]
    path = write_csv(tmp_path / ("list.csv" if delimiter == "," else "list.tsv"), rows, delimiter=delimiter)
    extra = ["id", "w", "ok", "tag", "none", "mix"]
    work, _ = read(tmp_path / "W", [path], extra_cols=extra)
    got = {r["row"]: (r["caption"], json.loads(r["extra"])) for r in work.iter_rows("url_list")}
    table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(delimiter=delimiter)).to_pylist()
    for n, (caption, values) in got.items():
        theirs = {c: table[n - 1][c] for c in extra}
        assert {c: (type(v), v) for c, v in values.items()} == {c: (type(v), v) for c, v in theirs.items()}
        assert caption == rows[n - 1]["caption"]
    assert got[3][1] == {"id": 102, "w": 2.25, "ok": True, "tag": "t2", "none": None, "mix": "x"}

    # A value past the sampled block that does not fit the inferred type is kept as text.
    from lait.crawler import url_list

    big = [dict(rows[0], url=f"http://b.test/{i}.jpg", id=str(i)) for i in range(30)]
    big[-1]["id"] = "n/a-later"
    path = write_csv(tmp_path / "late.csv", big)
    original, url_list.TYPE_SAMPLE_BYTES = url_list.TYPE_SAMPLE_BYTES, 400
    try:
        work, _ = read(tmp_path / "W2", [path], extra_cols=["id"])
    finally:
        url_list.TYPE_SAMPLE_BYTES = original
    ids = [json.loads(r["extra"])["id"] for r in sorted(work.iter_rows("url_list"), key=lambda r: r["row"])]
    assert ids == list(range(29)) + ["n/a-later"]


def test_txt_lists_and_bad_rows(tmp_path):
    txt = tmp_path / "urls.txt"
    txt.write_text("# a comment\nhttp://a.test/1.jpg\n\nhttps://b.test/2.png\nnot a url\n")
    work, _ = read(tmp_path / "W", [txt], caption_col="")
    kept, rejected = outcome(work)
    assert [k[0] for k in kept] == ["http://a.test/1.jpg", "https://b.test/2.png"]
    assert [r for r, *_ in rejected] == ["download/bad_url"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"url": "http://c.test/x.jpg", "caption": "ok here"}\n{broken\n[1, 2]\n')
    messy = tmp_path / "messy.csv"
    messy.write_text("url,caption\nhttp://e.test/1.jpg,fine\nhttp://e.test/2.jpg,too,many,fields\n")
    work, reports = read(tmp_path / "W2", [bad, messy])
    kept, rejected = outcome(work)
    assert [k[0] for k in kept] == ["http://c.test/x.jpg", "http://e.test/1.jpg"]
    details = sorted(d for r, _, d in rejected if r == "download/bad_row")
    assert details[0].startswith("bad.jsonl row 2: not JSON") and details[1].startswith("bad.jsonl row 3: a JSON list")
    assert details[2] == "messy.csv row 2: 4 fields where the header has 2"


def test_missing_columns_and_unknown_formats_are_one_line_errors(tmp_path):
    path = write_csv(tmp_path / "l.csv", [{"URL": "http://a.test/x.jpg", "TEXT": "a cat"}])
    with pytest.raises(ConfigError, match=r"no column 'url'.*'URL', 'TEXT'.*--url-col"):
        read(tmp_path / "W", [path])
    work, _ = read(tmp_path / "W", [path], url_col="URL", caption_col="TEXT")
    assert outcome(work)[0] == [("http://a.test/x.jpg", "a cat", None, 1)]
    with pytest.raises(ConfigError, match="--input-format"):
        list_format(str(tmp_path / "l.dat"))
    assert list_format(str(tmp_path / "l.dat"), "csv") == "csv"
    with pytest.raises(ConfigError, match="no such file"):
        expand_lists([str(tmp_path / "nope.csv")])
    with pytest.raises(ConfigError, match="matches nothing"):
        expand_lists([str(tmp_path / "*.parquet")])


def test_globs_duplicates_across_lists_and_reruns(tmp_path):
    a = write_csv(tmp_path / "part-0.csv", [{"url": "http://a.test/1.jpg", "caption": "one"},
                                             {"url": "http://a.test/2.jpg", "caption": "two"}])
    b = write_csv(tmp_path / "part-1.csv", [{"url": "http://a.test/2.jpg", "caption": "two again"},
                                             {"url": "http://a.test/3.jpg", "caption": "three"}])
    paths = expand_lists([str(tmp_path / "part-*.csv")])
    assert paths == [str(a), str(b)]
    work, reports = read(tmp_path / "W", paths)
    kept, rejected = outcome(work)
    assert sorted(k[0] for k in kept) == ["http://a.test/1.jpg", "http://a.test/2.jpg", "http://a.test/3.jpg"]
    assert [(r, d) for r, _, d in rejected] == [("download/duplicate_url", "part-1.csv row 1: the URL of part-0.csv row 2")]
    # Unchanged lists are skipped; a list read again alone still sees the other's URLs.
    work, reports = read(tmp_path / "W", paths)
    assert [r.skipped for r in reports] == [True, True]
    write_csv(b, [{"url": "http://a.test/1.jpg", "caption": "one again"}, {"url": "http://a.test/4.jpg", "caption": "four"}])
    work, reports = read(tmp_path / "W", paths)
    assert [r.skipped for r in reports] == [True, False]
    kept, rejected = outcome(work)
    assert sorted(k[0] for k in kept) == ["http://a.test/1.jpg", "http://a.test/2.jpg", "http://a.test/4.jpg"]
    assert [(r, d) for r, _, d in rejected] == [("download/duplicate_url", "part-1.csv row 1: the URL of part-0.csv row 1")]
    # Other column settings read the list again.
    work, reports = read(tmp_path / "W", paths, extra_cols=["caption"])
    assert [r.skipped for r in reports] == [False, False]


def test_url_normalisation():
    assert normalise_url(" http://Example.test/a b.jpg#x ") == ("http://example.test/a%20b.jpg", None)
    assert normalise_url("https://bücher.test/ä.jpg")[0] == "https://xn--bcher-kva.test/%C3%A4.jpg"
    assert normalise_url("http:///nohost.jpg") == (None, "no host")
    assert normalise_url("data:image/png;base64,AAAA") == (None, "not an http(s) URL")
    assert normalise_url("example.test/x.jpg") == (None, "not an http(s) URL")
    assert normalise_url(None) == (None, "empty URL")
    assert normalise_url("http://a.test/" + "x" * 3000)[1].startswith("longer than 2083")


PRIVATE_PAGES = {  # page URL -> what the crawler would call its address
    "http://169.254.169.254/latest/meta-data/": "metadata", "http://10.0.0.1/admin": "private",
    "http://[::1]:8080/": "loopback", "http://0x7f.1/": "loopback", "http://localhost/x": "loopback",
    "http://169.254.1.1/": "link-local", "http://photos.test/page.html": None, "http://93.184.216.34/": None,
}


@pytest.mark.parametrize("allow,kept", [
    ({}, {None}),
    ({"allow_loopback": True}, {None, "loopback"}),
    ({"allow_private": True}, {None, "private", "link-local"}),  # never metadata
])
def test_a_page_url_at_an_address_the_crawler_refuses_is_rejected(tmp_path, allow, kept):
    """Issue 51: a page column of `http://169.254.169.254/` was kept and reached shard JSON as
    page_url. The crawler's address rule applies to the page URLs of a list, with the same
    allowances, and the row is rejected with its reason, as a `javascript:` page URL is."""
    rows = [{"url": f"http://img.test/{i}.jpg", "caption": "a photo", "page": page}
            for i, page in enumerate(PRIVATE_PAGES)]
    path = write_csv(tmp_path / "pages.csv", rows)
    work, (report,) = read(tmp_path / "W", [path], page_col="page", **allow)
    got = {r["page_url"] for r in work.iter_rows("url_list")}
    assert got == {p for p, kind in PRIVATE_PAGES.items() if kind in kept}
    refused = {p: kind for p, kind in PRIVATE_PAGES.items() if kind not in kept}
    assert report.rejected == {"download/bad_page_url": len(refused)}
    details = {r["page_url"]: r["detail"] for r in work.iter_rows("rejected")}
    for page, kind in refused.items():
        assert f"page URL names a {kind} address" in details[page], details


def test_lait_download_applies_its_address_flags_to_page_urls(tmp_path):
    import subprocess
    import sys

    rows = [{"url": "http://img.test/1.jpg", "caption": "a photo", "page": "http://127.0.0.1:9/p.html"},
            {"url": "http://img.test/2.jpg", "caption": "a photo", "page": "http://169.254.169.254/"}]
    path = write_csv(tmp_path / "pages.csv", rows)
    done = subprocess.run([sys.executable, "-m", "lait", "download", str(path), "--out", str(tmp_path / "W"),
                           "--page-col", "page", "--allow-loopback", "--no-fetch", "--no-progress", "-q"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    work = WorkDir(tmp_path / "W")
    assert [r["page_url"] for r in work.iter_rows("url_list")] == ["http://127.0.0.1:9/p.html"]
    assert [(r["reason"], r["page_url"]) for r in work.iter_rows("rejected")] == \
        [("download/bad_page_url", "http://169.254.169.254/")]


def test_a_json_caption_that_is_not_text_rejects_its_row(tmp_path):
    """Issue 51: a caption that is a JSON list or number became Python's repr (`"['a', 'b']"`,
    `"nan"`). JSON lines have no column types, so the row, not the list, is refused, with its
    reason; a null caption is no caption. (A Parquet caption column of another type is refused
    whole: tests/lait/test_catalogue.py.)"""
    path = tmp_path / "list.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"url": "http://a.test/1.jpg", "caption": "a red bus"},
        {"url": "http://a.test/2.jpg", "caption": ["a", "b"]},
        {"url": "http://a.test/3.jpg", "caption": None},
        {"url": "http://a.test/4.jpg", "caption": {"en": "a dog"}},
    ]) + '{"url": "http://a.test/5.jpg", "caption": NaN}\n')
    work, (report,) = read(tmp_path / "W", [path])
    kept, rejected = outcome(work)
    assert kept == [("http://a.test/1.jpg", "a red bus", None, 1), ("http://a.test/3.jpg", None, None, 3)]
    assert [(r, d) for r, _, d in rejected] == [
        ("download/bad_row", "list.jsonl row 2: its 'caption' is a JSON list, not text"),
        ("download/bad_row", "list.jsonl row 4: its 'caption' is a JSON object, not text"),
        ("download/bad_row", "list.jsonl row 5: its 'caption' is a JSON number, not text")]
    assert report.rejected == {"download/bad_row": 3}


def test_nan_in_a_kept_column_is_null_not_invalid_json(tmp_path):
    """A float column's NaN (LAION's punsafe has them) was written into `extra` as `NaN`, which
    no strict JSON reader takes and shard JSON refuses; it is null, a missing value, as pandas'
    and Arrow's JSON writers write it."""
    path = tmp_path / "list.parquet"
    pq.write_table(pa.table({"url": ["http://a.test/1.jpg", "http://a.test/2.jpg"], "caption": ["a", "b"],
                             "punsafe": [float("nan"), 0.25], "scores": [[1.0, float("inf")], [0.5]]}), path)
    work, _ = read(tmp_path / "W", [path], extra_cols=["punsafe", "scores"])

    def strict(text):
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in {text}"))

    extras = {r["row"]: strict(r["extra"]) for r in work.iter_rows("url_list")}
    assert extras == {1: {"punsafe": None, "scores": [1.0, None]}, 2: {"punsafe": 0.25, "scores": [0.5]}}


# -- the list's encoding (issue 59) --------------------------------------------------------------

def _latin_1_rows(n: int) -> bytes:
    return ("url,caption\n" + "".join(f"http://a.test/{i}.jpg,un café noir {i}\n" for i in range(n))).encode("latin-1")


@pytest.mark.parametrize("name", ["list.csv", "list.csv.gz", "list.jsonl.bz2", "list.txt"])
def test_a_byte_that_is_not_utf_8_deep_in_a_list_is_named_by_offset_and_line(tmp_path, name):
    """Far past the first chunk the text reader decodes at once, in a compressed file too: the
    offset (of the uncompressed text) and the line are those of the byte, and nothing is kept."""
    if ".jsonl" in name:
        good = "".join(json.dumps({"url": f"http://a.test/{i}.jpg", "caption": f"café {i}"}) + "\n"
                       for i in range(20_000))
    elif ".csv" in name:
        good = "url,caption\n" + "".join(f"http://a.test/{i}.jpg,café {i}\n" for i in range(20_000))
    else:
        good = "".join(f"http://a.test/{i}.jpg\n" for i in range(20_000))
    raw = good.encode() + b"http://a.test/x\xe9.jpg\n"
    offset, line = len(good.encode()) + len(b"http://a.test/x"), good.count("\n") + 1
    path = tmp_path / name
    opener = {".gz": gzip.open, ".bz2": bz2.open}.get(path.suffix, open)
    with opener(path, "wb") as f:
        f.write(raw)
    kw = {"caption_col": ""} if name.endswith(".txt") else {}
    with pytest.raises(ConfigError) as err:
        read(tmp_path / "W", [path], **kw)
    message = str(err.value)
    assert f"byte e9 at offset {offset:,}" in message and f"line {line:,}" in message, message
    assert ("of the uncompressed text" in message) == (path.suffix in (".gz", ".bz2")), message
    assert WorkDir(tmp_path / "W").count("url_list") == 0


def test_encoding_errors_replace_counts_the_bytes_it_replaced(tmp_path):
    path = tmp_path / "list.csv"
    path.write_bytes(_latin_1_rows(3) + "http://a.test/9.jpg,gar\u00e7on \u00e9t\u00e9\n".encode("latin-1"))
    work, (report,) = read(tmp_path / "W", [path], encoding_errors="replace")
    kept, _ = outcome(work)
    assert [c for _, c, _, _ in kept] == ["un caf\ufffd noir 0", "un caf\ufffd noir 1", "un caf\ufffd noir 2",
                                          "gar\ufffdon \ufffdt\ufffd"]
    assert report.replaced == 6


def test_a_list_in_another_encoding_reads_with_it_and_a_byte_order_mark_is_skipped(tmp_path):
    latin = tmp_path / "latin.csv"
    latin.write_bytes(_latin_1_rows(2))
    utf16 = tmp_path / "utf16.csv"
    utf16.write_text("url,caption\nhttp://b.test/1.jpg,crème brûlée\n", encoding="utf-16")
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + "url,caption\nhttp://c.test/1.jpg,naïve\n".encode())
    captions = []
    for path, encoding in ((latin, "latin-1"), (utf16, "utf-16"), (bom, "utf-8")):
        work, (report,) = read(tmp_path / f"W-{path.stem}", [path], encoding=encoding)
        captions += [c for _, c, _, _ in outcome(work)[0]]
        assert report.replaced == 0
    assert captions == ["un café noir 0", "un café noir 1", "crème brûlée", "naïve"]


def test_the_default_decoding_keeps_the_markers_of_lists_read_before(tmp_path):
    """Lists read before these settings existed are not read again for them; another encoding is
    another reading, so it redoes the list."""
    from lait.crawler.url_list import _fingerprint

    path = write_csv(tmp_path / "list.csv", ROWS[:2])
    assert "encoding" not in _fingerprint(str(path), ListOptions())["settings"]
    assert _fingerprint(str(path), ListOptions(encoding="latin-1"))["settings"]["encoding"] == "latin-1"
