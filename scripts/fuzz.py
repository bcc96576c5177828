"""Coverage-guided fuzzing of lait's hostile-input surfaces with atheris (libFuzzer), where it
installs; `make fuzz` runs it after the long hypothesis run.

    .venv/bin/python scripts/fuzz.py page_reader --seconds 60
    .venv/bin/python scripts/fuzz.py all --seconds 30        # each target in its own process

Targets are those of `tests/kit/fuzz.py` (page_reader, warc_reader, image_decode,
config_loader), started from their seeds. An input that makes a target raise anything but its
documented error is written to fuzz-artifacts/ and the run exits non-zero. Without atheris the
script says so and exits 0: the hypothesis tests cover the same targets.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the test kit, tests/kit/
ARTIFACTS = REPO / "fuzz-artifacts"


def run_one(name: str, seconds: int) -> int:
    import atheris

    with atheris.instrument_imports(include=["lait"]):
        # The modules the targets run, imported here so that atheris sees their branches.
        import lait.config  # noqa: F401
        import lait.crawler.warc  # noqa: F401
        import lait.crawler.warc_ingest  # noqa: F401
        import lait.filters.image_decode  # noqa: F401
        import lait.filters.image_stage  # noqa: F401
        import lait.pagereader  # noqa: F401
        import lait.train.config  # noqa: F401
        from kit import fuzz

    target, seeds = fuzz.TARGETS[name]
    work = Path(tempfile.mkdtemp(prefix=f"lait-fuzz-{name}-"))
    corpus = work / "corpus"
    corpus.mkdir()
    for i, seed in enumerate(seeds()):
        (corpus / f"seed-{i}").write_bytes(seed)

    def one_input(data: bytes) -> None:
        if name == "page_reader" and data:
            target(data[1:], fuzz.ENCODINGS[data[0] % len(fuzz.ENCODINGS)])
        elif name in ("warc_reader", "config_loader"):
            target(data, workdir=work)
        else:
            target(data)

    ARTIFACTS.mkdir(exist_ok=True)
    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={seconds}", f"-artifact_prefix={ARTIFACTS}/{name}-",
                   "-rss_limit_mb=4096", "-max_len=65536"], one_input)
    atheris.Fuzz()  # exits the process when the time is up or on a crash
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("target", choices=["page_reader", "warc_reader", "image_decode", "config_loader", "all"])
    parser.add_argument("--seconds", type=int, default=60, help="fuzzing time per target")
    args = parser.parse_args(argv)
    try:
        import atheris  # noqa: F401
    except ImportError:
        print("fuzz: atheris is not installed here (pip install 'lait[fuzz]'); the hypothesis tests cover "
              "the same targets", file=sys.stderr)
        return 0
    if args.target != "all":
        return run_one(args.target, args.seconds)
    failed = []
    for name in ("page_reader", "warc_reader", "image_decode", "config_loader"):
        print(f"fuzz: {name} for {args.seconds} s", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, name, "--seconds", str(args.seconds)])
        if proc.returncode:
            failed.append(name)
    if failed:
        print(f"fuzz: inputs that break {', '.join(failed)} are in {ARTIFACTS}/", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
