"""The ``lait train`` command: ``pretrain``, ``finetune`` and ``eval``.

Kept light on purpose (no torch import here) so that ``lait --help`` stays fast; each command
loads its YAML config, applies ``--set KEY=VALUE`` and the shortcut flags, and runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

log = logging.getLogger(__name__)

_SET_HELP = "override a config value by dotted path, YAML-parsed (repeatable): --set stages.0.lr=5e-5"


def _common(p: argparse.ArgumentParser, with_run: bool = True) -> None:
    p.add_argument("--config", help="YAML config file (see train/configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    p.add_argument("--device", help="auto | cpu | cuda")
    if with_run:
        p.add_argument("--output-dir", help="run directory (checkpoints, log.jsonl, tensorboard/, config.yaml)")
        p.add_argument("--resume", help='"auto" (latest checkpoint in the output dir) or a checkpoint path')


def _shortcuts(args: argparse.Namespace, names: dict[str, str]) -> list[str]:
    out = []
    for attr, key in names.items():
        value = getattr(args, attr, None)
        if value is not None:
            out.append(f"{key}={json.dumps(value)}")  # JSON is YAML: strings stay strings
    return out + list(args.overrides)


def _setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _pretrain(args: argparse.Namespace) -> int:
    from lait.train.config import PretrainConfig, load_config
    from lait.train.pretrain import run_pretrain

    _setup_logging()
    cfg = load_config(PretrainConfig, args.config, _shortcuts(args, {"output_dir": "output_dir", "resume": "resume", "device": "device"}))
    run_pretrain(cfg)
    return 0


def _finetune(args: argparse.Namespace) -> int:
    from lait.train.config import FinetuneConfig, load_config
    from lait.train.finetune import run_finetune

    _setup_logging()
    names = {"output_dir": "output_dir", "resume": "resume", "device": "device", "init_from": "init_from", "loss": "loss", "shards": "stage.shards"}
    cfg = load_config(FinetuneConfig, args.config, _shortcuts(args, names))
    run_finetune(cfg)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from lait.train.config import EvalConfig, load_config
    from lait.train.evaluate import run_eval

    _setup_logging()
    names = {"checkpoint": "checkpoint", "shards": "shards", "karpathy_json": "karpathy_json", "image_root": "image_root",
             "mode": "mode", "shortlist_k": "shortlist_k", "limit": "limit", "output": "output", "device": "device"}
    cfg = load_config(EvalConfig, args.config, _shortcuts(args, names))
    if not cfg.checkpoint:
        raise SystemExit("lait train eval: --checkpoint is required")
    result = run_eval(cfg)
    print(json.dumps(result, indent=2))
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``train`` with its ``pretrain``, ``finetune`` and ``eval`` sub-commands."""
    train = subparsers.add_parser(
        "train", help="ImageBERT pretraining, retrieval finetuning and evaluation",
        description="Train ImageBERT (Qi et al., 2020) on lait shards. Runs on CUDA (bf16) when present, "
                    "CPU otherwise; launch with torchrun for DDP.",
    )
    sub = train.add_subparsers(dest="train_command", required=True, metavar="{pretrain,finetune,eval}")

    p = sub.add_parser("pretrain", help="multi-stage MLM/MOC/MRFR/ITM pretraining",
                       description="Pretrain ImageBERT through the stages of a config (train/configs/pretrain-example.yaml); "
                                   "each stage starts from the previous one's weights.")
    _common(p)
    p.set_defaults(func=_pretrain)

    f = sub.add_parser("finetune", help="image-text retrieval finetuning (binary, multi-class or triplet ITM loss)",
                       description="Finetune the ITM head for retrieval with mined hard negatives.")
    _common(f)
    f.add_argument("--init-from", help="ImageBERT checkpoint (.pt) from pretraining")
    f.add_argument("--loss", choices=["binary", "multiclass", "triplet"])
    f.add_argument("--shards", help="training shards (dir, brace pattern or glob)")
    f.set_defaults(func=_finetune)

    e = sub.add_parser("eval", help="R@1/5/10 image-to-text and text-to-image, full or shortlist",
                       description="Evaluate retrieval on shards (one caption per image) or a Karpathy-style JSON "
                                   "(five captions per image). 'full' scores every pair with ITM; 'shortlist' re-ranks "
                                   "the embedding top-k with ITM and is reported as such.")
    _common(e, with_run=False)
    e.add_argument("--checkpoint", help="ImageBERT checkpoint (.pt)")
    e.add_argument("--shards", help="evaluation shards")
    e.add_argument("--karpathy-json", help="Karpathy-style JSON instead of shards")
    e.add_argument("--image-root", help="directory the JSON's image paths are relative to")
    e.add_argument("--mode", choices=["full", "shortlist"])
    e.add_argument("--shortlist-k", type=int)
    e.add_argument("--limit", type=int, help="evaluate on the first N images")
    e.add_argument("--output", help="write the metrics JSON here")
    e.set_defaults(func=_eval)
    return train


def main(argv: list[str] | None = None) -> int:
    """The training commands from a list of arguments (``["pretrain", "--config", ...]``): what
    tests and torchrun scripts call; ``torchrun ... -m lait train pretrain ...`` works as well."""
    parser = argparse.ArgumentParser(prog="lait")
    subs = parser.add_subparsers(dest="command", required=True)
    register(subs)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        argv = ["train", *argv]
    args = parser.parse_args(argv)
    return int(args.func(args))
