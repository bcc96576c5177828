"""The ``lait train`` command: ``pretrain``, ``finetune`` and ``eval``.

Each command's flags come from its config dataclass (``lait.train.config``), which resolves like
every lait command's: defaults < ``--config`` YAML < flags < ``--set KEY=VALUE``. A config mistake
is one line on stderr and exit status 2. Kept light on purpose (no torch import here) so that
``lait --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from lait.app.commands import Parser, finish_sub_commands
from lait.config import Config, ConfigError
from lait.train.config import EvalConfig, FinetuneConfig, PretrainConfig

log = logging.getLogger(__name__)

CONFIG_EPILOG = """\
Settings resolve as: defaults < --config YAML < flags < --set. Nested settings (data.regions,
stages, stage.optim, ...) have no flags; set them in the YAML or with --set, e.g.
  --set data.regions.source=patches --set stages.0.optim.lr=5e-5 --set 'stages=[{name: a, shards: d/}]'
The resolved config is written to OUTPUT_DIR/config.yaml.
"""


def _setup_logging() -> None:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _pretrain(cfg: PretrainConfig) -> int:
    from lait.train.pretrain import run_pretrain

    run_pretrain(cfg)
    return 0


def _finetune(cfg: FinetuneConfig) -> int:
    from lait.train.finetune import run_finetune

    run_finetune(cfg)
    return 0


def _eval(cfg: EvalConfig) -> int:
    from lait.train.evaluate import run_eval

    print(json.dumps(run_eval(cfg), indent=2))
    return 0


def _run(name: str, config_cls: type[Config], run: Callable[[Any], int], shortcuts: dict[str, str],
         args: argparse.Namespace) -> int:
    """Resolve the config, run; a config mistake ends as one line and exit status 2."""
    _setup_logging()
    given = [f"{path}={json.dumps(getattr(args, flag))}" for flag, path in shortcuts.items()
             if getattr(args, flag, None) is not None]  # JSON is YAML: a string stays a string
    args.set_overrides = given + list(args.set_overrides)  # an explicit --set wins
    try:
        return run(config_cls.from_args(args))
    except ConfigError as exc:
        print(f"lait train {name}: {exc}", file=sys.stderr)
        return 2


def _command(sub: argparse._SubParsersAction, name: str, config_cls: type[Config], run: Callable[[Any], int],
             *, help: str, description: str, shortcuts: dict[str, tuple[str, str]] | None = None) -> None:
    """A sub-command with a flag per top-level setting of `config_cls`, plus `shortcuts`: flags
    for nested settings, {flag dest: (dotted path, help)}."""
    p = sub.add_parser(name, help=help, description=description, epilog=CONFIG_EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    config_cls.add_arguments(p)
    for dest, (path, help_) in (shortcuts or {}).items():
        p.add_argument("--" + dest.replace("_", "-"), dest=dest, metavar=dest.upper(), help=f"{help_} (sets {path})")
    paths = {dest: path for dest, (path, _) in (shortcuts or {}).items()}
    p.set_defaults(func=lambda args: _run(name, config_cls, run, paths, args))


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``train`` with its ``pretrain``, ``finetune`` and ``eval`` sub-commands."""
    train = subparsers.add_parser(
        "train", help="ImageBERT pretraining, retrieval finetuning and evaluation",
        description="Train ImageBERT (Qi et al., 2020) on lait shards. Runs on CUDA (bf16) when present, "
                    "CPU otherwise; launch with torchrun for DDP. `lait train COMMAND --help` lists each "
                    "command's settings.",
    )
    sub = train.add_subparsers(dest="train_command", required=True, metavar="{pretrain,finetune,eval}")
    _command(sub, "pretrain", PretrainConfig, _pretrain, help="multi-stage MLM/MOC/MRFR/ITM pretraining",
             description="Pretrain ImageBERT through the stages of a config (train/configs/pretrain-example.yaml); "
                         "each stage starts from the previous one's weights.")
    _command(sub, "finetune", FinetuneConfig, _finetune,
             help="image-text retrieval finetuning (binary, multi-class or triplet ITM loss)",
             description="Finetune the ITM head for retrieval with mined hard negatives.",
             shortcuts={"shards": ("stage.shards", "training shards (dir, brace pattern or glob)")})
    _command(sub, "eval", EvalConfig, _eval, help="R@1/5/10 image-to-text and text-to-image, full or shortlist",
             description="Evaluate retrieval on shards (one caption per image) or a Karpathy-style JSON "
                         "(five captions per image). 'full' scores every pair with ITM; 'shortlist' re-ranks "
                         "the embedding top-k with ITM and is reported as such.")
    return train


def main(argv: list[str] | None = None) -> int:
    """The training commands from a list of arguments (``["pretrain", "--config", ...]``): what
    tests and torchrun scripts call; ``torchrun ... -m lait train pretrain ...`` works as well."""
    parser = Parser(prog="lait")
    subs = parser.add_subparsers(dest="command", required=True)
    register(subs)
    finish_sub_commands(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        argv = ["train", *argv]
    args = parser.parse_args(argv)
    return int(args.func(args))
