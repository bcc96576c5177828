#!/usr/bin/env bash
# One GPU node's figures in one go (issue 46): stage 4 beside the model alone for ViT-B-32 and
# ViT-L-14 at 50,000 images, the decode paths side by side, the trainer's samples/s and MFU at two
# batch sizes, stage 2's safety models; a Markdown table in OUT/results.md with the machine's name.
#
#   bench/gpu/run.sh [--smoke] [--out DIR] [--photos DIR] [--tmp DIR] [--tokenizer PATH]
#
# Meant to finish in about 8 minutes on a 16-core H100/H200; each section runs in its own process
# under a time limit, so one that fails or hangs costs its own line, not the others. It installs
# nothing: where a package is missing, the `env` line says which and the sections that need it are
# skipped (docs/performance.md, "GPU", says how to bring lait and its wheels to a GPU image).
# --smoke runs the same code on the CPU at tiny sizes in about a minute: the test suite does, so
# that the script cannot rot between GPU runs.
set -uo pipefail
cd "$(dirname "$0")/../.."

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
OUT=${OUT:-bench/gpu/out}
SMOKE=""
PHOTOS=""
TMPDIR_ARG=""
TOKENIZER=""
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE="--smoke" ;;
        --out) OUT="$2"; shift ;;
        --photos) PHOTOS="$2"; shift ;;
        --tmp) TMPDIR_ARG="$2"; shift ;;
        --tokenizer) TOKENIZER="$2"; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
rm -f "$OUT/results.jsonl" "$OUT/results.md"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

common=(--out "$OUT" $SMOKE)
[ -n "$PHOTOS" ] && common+=(--photos "$PHOTOS")
[ -n "$TMPDIR_ARG" ] && common+=(--tmp "$TMPDIR_ARG")
[ -n "$TOKENIZER" ] && common+=(--tokenizer "$TOKENIZER")

if [ -n "$SMOKE" ]; then
    decode=(--images 48 --workers 2)
    score=(--images 64 --batch 16 --workers 2)
    train=(--batches 8,16,8:eager --steps 6 --log-every 2 --loader-workers 0)
    limits=(60 120 300 240 120)
else
    decode=(--images 8192)
    score=(--images 50000 --batch 512)
    train=(--batches 96,1024,96:eager --steps 60 --log-every 10 --samples 6000 --loader-workers 12 --run-timeout 110)
    limits=(30 50 170 190 45)
fi

status=0
run() {  # run SECONDS SECTION ARGS...
    local limit=$1 section=$2
    shift 2
    echo "== $section (at most ${limit} s)"
    timeout --kill-after=10 "$limit" "$PYTHON" bench/gpu/gpu_bench.py "$section" "${common[@]}" "$@"
    local rc=$?
    if [ $rc -ne 0 ]; then
        status=1
        echo "{\"section\": \"$section\", \"what\": \"section failed\", \"value\": \"exit $rc\", \"unit\": \"\", \"note\": \"$([ $rc -eq 124 ] && echo "over its ${limit} s limit")\"}" >>"$OUT/results.jsonl"
    fi
}

run "${limits[0]}" env
run "${limits[1]}" decode "${decode[@]}"
run "${limits[2]}" score "${score[@]}"
run "${limits[3]}" train "${train[@]}"
run "${limits[4]}" gates
"$PYTHON" bench/gpu/gpu_bench.py report --out "$OUT" >/dev/null && echo "== table: $OUT/results.md" && cat "$OUT/results.md"
exit $status
