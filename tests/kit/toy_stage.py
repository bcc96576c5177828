"""A small deterministic stage for the executor tests; also runnable as a script:

    PYTHONPATH=tests python -m kit.toy_stage WORK WORKERS [FAIL_PARTITION]

It reads `images/`, keeps rows whose hash is even (with sha256 and a fake size), rejects the
others with `toy/odd`, and sleeps TOY_SLEEP seconds per partition so a test can kill it midway.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from datetime import datetime, timezone

from lait.executor import LocalExecutor
from lait.parts import PartContext
from lait.reasons import register
from lait.stage import Stage
from lait.workdir import WorkDir, partition_of

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
# Registered on import, so in every worker process that unpickles the stage too.
register("toy/odd", "the toy stage drops images whose bytes hash to an odd number.")


class ToyStage(Stage):
    name = "toy"
    input_table = "images"
    output_tables = ("images_ok",)

    def __init__(self, fail_partition: int | None = None, sleep: float = 0.0):
        self.fail_partition = fail_partition
        self.sleep = sleep

    def process(self, ctx: PartContext) -> None:
        if ctx.partition == self.fail_partition:
            raise RuntimeError(f"toy failure in partition {ctx.partition}")
        for row in ctx.work.iter_rows("images", ctx.partition):
            digest = hashlib.sha256(row["bytes"]).hexdigest()
            if int(digest, 16) % 2:
                ctx.reject("odd", image_url=row["image_url"], detail=digest[:8])
                continue
            ctx.write("images_ok", {**row, "width": len(row["bytes"]), "height": 1, "format": "RAW",
                                    "sha256": digest, "phash": digest[:16]})
        time.sleep(self.sleep)


def make_input(root, n_rows: int = 400, n_partitions: int = 8) -> WorkDir:
    work = WorkDir(root, n_partitions=n_partitions).init()
    writers = {}
    for i in range(n_rows):
        url = f"http://127.0.0.1/img/{i}.jpg"
        p = partition_of(url, n_partitions)
        if p not in writers:
            writers[p] = work.writer("images", p, "input")
        writers[p].write({"image_url": url, "page_url": "http://127.0.0.1/", "bytes": str(i * 7919).encode(),
                          "mime": "image/jpeg", "status": 200, "fetched_at": T0})
    for w in writers.values():
        w.close()
    return work


if __name__ == "__main__":
    work_root, workers = sys.argv[1], int(sys.argv[2])
    fail = int(sys.argv[3]) if len(sys.argv) > 3 else None
    stage = ToyStage(fail_partition=fail, sleep=float(os.environ.get("TOY_SLEEP", "0")))
    report = LocalExecutor(workers=workers, retries=1, show_progress=False).run(stage, work_root)
    print(report.summary(), flush=True)
    sys.exit(0 if report.ok else 1)
