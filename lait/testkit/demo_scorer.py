"""The offline demo scorer: a tiny open_clip model trained here on the built-in web's scenes.

`lait demo` runs without internet, so no pretrained CLIP can be downloaded. Instead the
project trains its own tiny CLIP (a 2-layer ViT on 64 px images and a 2-layer text
transformer, about 3.4 M parameters) on scenes drawn by `lait.testkit.scenes` and captioned
by `describe` in English, German and French, the languages of the local web. Each step adds
a batch of junk texts (file names, "click here", "logo", credits, headlines, unrelated news
sentences) as extra negatives of every image, so junk scores low against every picture.

Training is reproducible (fixed seeds, deterministic data) and takes about a minute and a half on two
CPU cores, with a progress bar and time estimate for the scenes and the steps. The result is cached and reused:

    lait score WORK --model demo            # builds the demo scorer on first use, then scores
    lait score --build-demo-model           # only build it (prints where it is)
    python -m lait.testkit.demo_scorer [DIR]  # the same, from Python

`lait demo` calls `ensure_demo_model(dir)` and scores with `ScoreConfig(model="demo", demo_dir=dir)`.
The cache directory is `demo_dir`, else `$LAIT_DEMO_MODEL_DIR`, else `$LAIT_CACHE/demo-scorer-v2` (default `~/.cache/lait`): an open_clip
`local-dir:` model folder with `open_clip_config.json` and `open_clip_model.safetensors`, so
`open_clip.create_model("local-dir:DIR")` loads it without lait.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lait.memory import media_heap
from lait.scoring.model import DEMO_CONFIG, DEMO_VERSION, DEMO_WEIGHTS, demo_scorer_dir

log = logging.getLogger(__name__)

# Every setting here changes the trained weights: bump DEMO_VERSION (lait.scoring.model) when
# editing them.
DEMO_MODEL_CFG = {
    "embed_dim": 64,
    "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 64, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
# Squash instead of centre-crop: the site's captions name shapes at the left and right edge.
DEMO_PREPROCESS_CFG = {"resize_mode": "squash"}
TRAIN_SIZES = ((384, 320), (480, 360), (320, 400), (512, 384))


@dataclass(frozen=True)
class DemoModel:
    """A built demo scorer: an open_clip `local-dir:` folder (config JSON and weights)."""

    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / DEMO_CONFIG

    @property
    def checkpoint_path(self) -> Path:
        return self.root / DEMO_WEIGHTS

    @property
    def model_name(self) -> str:
        """The name to give `open_clip.create_model` (or `lait score --model`)."""
        return f"local-dir:{self.root}"


def ensure_demo_model(cache_dir: str | os.PathLike | None = None, *, steps: int = 360,
                      seed: int = 0) -> DemoModel:
    """The demo scorer in `cache_dir`, trained first if it is not there yet.

    Concurrent callers (several worker processes) wait on a file lock, so it is built once.
    """
    out = demo_scorer_dir(cache_dir)
    model = DemoModel(out)
    if model.checkpoint_path.exists() and model.config_path.exists():
        return model
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # Another process builds it (a minute or two): say so rather than sit silent.
            log.info("waiting for another process that is building the demo scorer in %s", out)
            start = time.monotonic()
            fcntl.flock(lock, fcntl.LOCK_EX)
            log.info("the demo scorer is ready after %.0f s of waiting", time.monotonic() - start)
        if not model.checkpoint_path.exists():
            log.info("building the demo scorer in %s (one-off, about a minute and a half)", out)
            # Training allocates and frees the same few-MB tensors every step: under lait's pinned
            # 1 MiB mmap threshold each is a fresh mapping whose pages fault in anew, which made a
            # step 2.1x slower (0.56 s against 0.28 s, 96 M minor faults in one demo). The heap of
            # `media_heap` recycles them; the weights are the same either way.
            with media_heap():
                train_demo_model(out, steps=steps, seed=seed)
    return model


# ---------------------------------------------------------------------------------------
# Texts: captions (positives) and junk (negatives)

_CONTEXT = {
    "en": ("The photo above shows {c}.", "The picture shows {c}.", "Above: {c}.", "{c}"),
    "de": ("Das Foto oben zeigt {c}.", "Auf dem Bild: {c}.", "{c}"),
    "fr": ("La photo ci-dessus montre {c}.", "Sur l'image : {c}.", "{c}"),
}
_CREDIT = ("Photo: Staff", "Photo: Archive", "Image: Studio", "Foto: Redaktion", "Photo : rédaction",
           "Credit: Reuters", "(c) 2024")
_GENERIC = ("image", "photo", "picture", "logo", "click here", "untitled", "chart", "share", "print",
            "mail", "rss", "banner", "thumbnail", "read more", "home", "about", "icon", "spacer",
            "Bild", "Foto", "Grafik", "hier klicken", "image", "cliquez ici", "graphique", "avatar",
            "placeholder", "header image", "cover", "gallery", "slide 1", "figure 2", "menu")
_HEADLINE = {
    "en": ("{a} {t} from {p}", "What we learned in {p}", "{a} ideas for {t}", "A week of {t} in {p}"),
    "de": ("{a} {t} aus {p}", "Eine Woche in {p}"),
    "fr": ("{a} {t} de {p}", "Une semaine à {p}"),
}
_WORDS = {
    "en": (("New", "Bright", "Quiet", "Bold", "Simple", "Hidden", "Strange", "Early"),
           ("shapes", "colours", "patterns", "studio notes", "forms", "prints", "ideas"),
           ("Lisbon", "Oslo", "the studio", "the gallery", "Kyoto", "the archive", "Madrid")),
    "de": (("Neue", "Helle", "Stille", "Kühne", "Frühe"), ("Formen", "Farben", "Muster", "Ideen"),
           ("Berlin", "Hamburg", "dem Atelier", "Wien", "Köln")),
    "fr": (("Nouvelles", "Belles", "Discrètes", "Simples"), ("formes", "couleurs", "motifs", "idées"),
           ("Paris", "Lyon", "l'atelier", "Marseille", "Nantes")),
}
_SENTENCES = {
    "en": ("Our team spent {n} days in {p} looking at {t}.", "The exhibition is open until Sunday.",
           "Admission is free for students and members.", "Readers wrote in after last week's story.",
           "We talked to {n} artists who work with {t}.", "The results surprised the organisers.",
           "More pictures will follow in the coming weeks.", "Subscribe to our newsletter for updates.",
           "The museum reopened after a long renovation.", "Tickets sold out within {n} hours.",
           "This article was updated on Monday.", "Share this story with your friends.",
           "The project took {n} months to complete.", "Critics praised the quiet mood of the show."),
    "de": ("Unser Team war {n} Tage in {p} unterwegs.", "Die Ausstellung läuft bis Ende des Monats.",
           "Der Eintritt ist frei.", "Wir haben mit {n} Künstlern gesprochen.",
           "Weitere Bilder folgen in den nächsten Wochen.", "Das Museum wurde renoviert."),
    "fr": ("Notre équipe a passé {n} jours à {p}.", "L'exposition dure jusqu'à la fin du mois.",
           "L'entrée est gratuite.", "Nous avons rencontré {n} artistes.",
           "D'autres images suivront bientôt.", "Le musée a rouvert après des travaux."),
}


def junk_text(rng: random.Random) -> str:
    """A text that says nothing about any picture, of the kinds web pages attach to images."""
    kind = rng.random()
    lang = rng.choice(("en", "en", "de", "fr"))
    adj, thing, place = _WORDS[lang]
    if kind < 0.2:
        stem = rng.choice(("IMG_", "DSC", "DSC_", "image-", "photo_", "P", "screenshot-", "file"))
        ext = rng.choice(("JPG", "jpg", "jpeg", "png", "PNG", "gif", "webp"))
        return f"{stem}{rng.randint(0, 99999):0{rng.choice((4, 5))}d}.{ext}"
    if kind < 0.4:
        return rng.choice(_GENERIC)
    if kind < 0.5:
        return rng.choice(_CREDIT)
    if kind < 0.65:
        text = rng.choice(_HEADLINE[lang]).format(a=rng.choice(adj), t=rng.choice(thing), p=rng.choice(place))
        return text + (f" ({rng.randint(0, 999)})" if rng.random() < 0.5 else "")
    n = rng.randint(1, 2)
    return " ".join(rng.choice(_SENTENCES[lang]).format(n=rng.randint(2, 12), p=rng.choice(place),
                                                         t=rng.choice(thing)) for _ in range(n))


def caption_text(scene, rng: random.Random) -> str:
    """A true caption of `scene` as a page may carry it: plain, in a sentence, or with a credit."""
    from lait.testkit.scenes import describe

    lang = rng.choices(("en", "de", "fr"), (0.6, 0.2, 0.2))[0]
    cap = describe(scene, rng, lang)
    r = rng.random()
    if r < 0.25:
        cap = rng.choice(_CONTEXT[lang]).format(c=cap)
    elif r < 0.35:
        cap = f"{cap} {rng.choice(_CREDIT)}"
    return cap


# ---------------------------------------------------------------------------------------
# Training


def _render(args: tuple[int, int]) -> tuple[np.ndarray, object]:
    """Scene `k` of the training set as the scorer sees it (a uint8 HWC array)."""
    from PIL import Image

    from lait.testkit.scenes import random_scene, render_scene

    seed, k = args
    rng = random.Random(seed * 1_000_003 + k)
    scene = random_scene(rng)
    w, h = rng.choice(TRAIN_SIZES)
    img = render_scene(scene, w, h, seed=k)
    size = DEMO_MODEL_CFG["vision_cfg"]["image_size"]
    # The same squash resize the scorer's preprocessing does (bicubic, PIL).
    return np.asarray(img.resize((size, size), Image.BICUBIC)), scene


def _render_all(n: int, seed: int) -> tuple[np.ndarray, list]:
    from lait.log import progress

    jobs = [(seed, k) for k in range(n)]
    workers = min(4, os.cpu_count() or 1)
    out = []
    with progress(total=n, desc="demo scenes", unit="scene") as bar:
        with contextlib.ExitStack() as stack:
            if workers > 1:
                pool = stack.enter_context(ProcessPoolExecutor(workers))
                rendered = pool.map(_render, jobs, chunksize=64)
            else:
                rendered = map(_render, jobs)
            for r in rendered:
                out.append(r)
                bar.update(1)
    return np.stack([a for a, _ in out]), [s for _, s in out]


class _RandomInitWarning(logging.Filter):
    """Drops open_clip's lines (logged on the root logger) while it builds the one model lait
    initializes randomly on purpose: "Local config loaded, but no CLIP weights found", "No
    pretrained weights loaded ... Model initialized randomly" and their like. Errors pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or "open_clip" not in record.pathname


@contextmanager
def _without_random_init_warning():
    root, only = logging.getLogger(), _RandomInitWarning()
    root.addFilter(only)
    try:
        yield
    finally:
        root.removeFilter(only)


def train_demo_model(out_dir: str | os.PathLike, *, steps: int = 360, seed: int = 0, n_images: int = 2400,
                     batch: int = 128, n_junk: int = 96, lr: float = 2e-3) -> DemoModel:
    """Train the demo scorer from scratch and write its config and weights to `out_dir`."""
    import open_clip
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file

    from lait.log import progress

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    images, scenes = _render_all(n_images, seed)
    log.info("demo scorer: rendered %d scenes in %.1fs", n_images, time.perf_counter() - start)

    result = DemoModel(out)
    from lait.writers import atomic_write_bytes

    atomic_write_bytes(result.config_path, json.dumps(
        {"model_cfg": DEMO_MODEL_CFG, "preprocess_cfg": DEMO_PREPROCESS_CFG}, indent=1).encode())
    torch.manual_seed(seed)
    # No weights in the folder yet: open_clip builds the architecture with random weights, which
    # is the point here (training from scratch), so its warning about it is lait's line below.
    log.info("demo scorer: training a tiny CLIP from scratch (random initial weights on purpose: no "
             "pretrained model is downloaded, the demo runs offline)")
    with _without_random_init_warning():
        model = open_clip.create_model(result.model_name)
        tokenizer = open_clip.get_tokenizer(result.model_name)
    model.train()
    pp = model.visual.preprocess_cfg
    mean = torch.tensor(pp["mean"]).view(1, 3, 1, 1)
    std = torch.tensor(pp["std"]).view(1, 3, 1, 1)
    pixels = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps)))
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    bar = progress(range(steps), desc="demo scorer", unit="step")
    for step in bar:
        idx = torch.randperm(len(scenes), generator=gen)[:batch]
        x = pixels[idx].float() / 255.0
        # Cheap photometric jitter: the site's JPEGs differ a little from the raw renders.
        x = (x * (1 + 0.1 * (torch.rand(len(idx), 1, 1, 1, generator=gen) - 0.5))).clamp(0, 1)
        x = (x - mean) / std
        texts = [caption_text(scenes[i], rng) for i in idx.tolist()] + [junk_text(rng) for _ in range(n_junk)]
        tokens = tokenizer(texts)
        img = F.normalize(model.encode_image(x), dim=-1)
        txt = F.normalize(model.encode_text(tokens), dim=-1)
        scale = model.logit_scale.exp().clamp(max=100)
        logits = scale * img @ txt.T  # images against captions and junk
        target = torch.arange(len(idx))
        loss = (F.cross_entropy(logits, target) + F.cross_entropy(logits[:, : len(idx)].T, target)) / 2
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            log.info("demo scorer step %d/%d loss %.3f", step, steps, loss.item())
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    model.eval()
    tmp = out / ".tmp-open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp),
              metadata={"lait": f"demo scorer {DEMO_VERSION}", "steps": str(steps), "seed": str(seed)})
    os.replace(tmp, result.checkpoint_path)
    log.info("demo scorer: trained %d steps in %.1fs -> %s", steps, time.perf_counter() - start, out)
    return result


def main(argv: list[str] | None = None) -> int:
    from lait.log import setup_logging

    setup_logging()
    argv = sys.argv[1:] if argv is None else argv
    model = ensure_demo_model(argv[0] if argv else None)
    print(model.checkpoint_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
