"""The `lait` command: one sub-command per pipeline step, each with its own `--help`.

Command modules expose `register(subparsers)`; they import heavy libraries (torch, scrapy)
inside their functions, so `lait --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from lait import __version__, errors
from lait.app.commands import Parser, add_global_flags, finish_sub_commands
from lait.config import ConfigError
from lait.log import setup_logging
from lait.memory import apply_memory_settings
from lait.startup import skip_pandas_probe

log = logging.getLogger("lait")

# In the order `lait --help` lists them.
COMMAND_MODULES = [
    "lait.app.site",
    "lait.app.crawl",
    "lait.app.ingest",
    "lait.app.download",
    "lait.app.stages",
    "lait.app.score",
    "lait.app.build",
    "lait.app.documents",
    "lait.app.select",
    "lait.app.compare",
    "lait.app.export",
    "lait.app.run",
    "lait.app.status",
    "lait.app.verify",
    "lait.app.models",
    "lait.app.stats",
    "lait.app.demo",
    "lait.app.train",
]

# Stage 1: the fetch commands, whose processes hand pyarrow no pandas objects (lait.startup).
STAGE1_COMMANDS = {"crawl", "download", "ingest-warc"}

EPILOG = """\
the pipeline (LAIT, ImageBERT paper):
  lait crawl --seeds seeds.txt --out work/          1. collect pages and images (Scrapy)
  lait ingest-warc CC-MAIN-*.warc.gz --out work/    1. or read Common Crawl archives
  lait download urls.parquet --out work/            1. or fetch a URL list with captions
  lait filter work/                                 2. image content filtering
  lait clean work/                                  3. sentence detection and cleaning
  lait score work/                                  4. image-text semantic scoring
  lait build work/                                  5. aggregation into WebDataset shards
  lait verify work/                                 read every part, image and shard back
  lait select work/ --out sel/ --top-fraction 0.3   other shards from the scored pool, no rescoring
  lait compare work/ --recipe clip-top30 --recipe all --eval set.json   train on each selection, compare R@K
  lait export-embeddings work/ --out embs/          embeddings for clip-retrieval and faiss
  lait run work/ --config pipeline.yaml             stages 2-5 in one go, resumable
  lait status work/                                 what is done, what is stale and why
  lait demo --out demo/                             the whole job offline on a built-in web
  lait models                                       the pretrained models that load offline

`lait COMMAND --help` explains each command. A config file (--config) may be at most 1 MiB.
Output piped into a reader that stops early (`lait status work/ | head -3`) ends the command
quietly, with exit status 141 (128 + SIGPIPE) as the shell's own tools give.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="lait",
        description="Build image-text pretraining datasets from the web (LAIT) and train ImageBERT on them.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"lait {__version__}")
    add_global_flags(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    finish_sub_commands(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    apply_memory_settings()  # before the command modules load pyarrow: see lait.memory
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    setup_logging(-1 if args.quiet else args.verbose)
    if argv is None and args.command in STAGE1_COMMANDS:
        skip_pandas_probe()  # the process is this command, which sees no pandas objects: see lait.startup
    try:
        code = int(args.func(args) or 0)
        if sys.stdout is not None:
            sys.stdout.flush()  # here, not at exit, so that a reader gone early is seen below
        return code
    except BrokenPipeError:
        if not stdout_closed():
            raise  # another pipe than stdout (a child's): not the reader being done
        return quiet_exit_on_closed_stdout()
    except ConfigError as exc:
        print(f"lait {args.command}: {exc}", file=sys.stderr)
        return 2
    except errors.CorruptPart as exc:  # read outside a stage's tasks (a build's global steps)
        print(f"lait {args.command}: {exc}; `lait verify` names every damaged file", file=sys.stderr)
        return 1
    except Exception as exc:  # a full disk, a read-only one: one line naming the path, no traceback
        line = errors.user_error(exc)
        if line is None or args.verbose > 0:
            raise
        print(f"lait {args.command}: {line}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"lait {args.command}: interrupted", file=sys.stderr)
        return 130


def stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader has gone (`lait status work/ | head -3`
    once head has its lines): polled, so a broken pipe of something else is not taken for it."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll here, or stdout not a real file
        return False


def quiet_exit_on_closed_stdout() -> int:
    """End a command whose stdout reader has gone as `head`'s writer ends in a shell: quietly,
    with status 141 (128 + SIGPIPE), as a program killed by SIGPIPE reports. stdout is pointed at
    /dev/null, so that Python's flush at exit does not print the error once more."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141


if __name__ == "__main__":
    sys.exit(main())
