"""Stage 1's units of work, on one machine or on a Ray cluster.

The images a URL list or an archive's pages name are fetched in *units*: each unit is a set of
host buckets (a stable hash of the host, modulo `N_BUCKETS`), fetched by one `lait-images`
spider in its own process. A host belongs to exactly one unit and a unit runs in one place at
a time, so per-host politeness, robots.txt, TDMRep and the host-down rule hold however many
machines fetch side by side. The driver counts the images each bucket still lacks and packs
the buckets into units of about equal work (largest first, each into the lightest unit), so a
few big hosts do not leave one unit running long after the others.

- local (`--processes P`): P units, all running at once, one process each;
- Ray (`--executor ray`): several units per task slot of the cluster (`UNITS_PER_SLOT`), each a
  Ray task that runs the spider on its node and writes its own parts into the one work
  directory (a shared filesystem or object storage) under the driver's lock. A task whose node
  dies is run again elsewhere (Ray's `max_retries`); it skips what its first run committed
  (an image with an `images/` row or a `crawl/` reject is done), so every URL ends once in the
  tables. The rows of the parts a killed spider had open are lost with it and fetched again.

`lait ingest-warc`'s unit is one archive file (`crawler.warc_ingest`), run the same way.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterator

from lait.crawler.config import ImageFetchConfig, host_share
from lait.workdir import WorkDir

N_BUCKETS = 4096
UNITS_PER_SLOT = 4  # on Ray: small enough units that the slots finish together, few enough to start cheaply


def pending_images(work: WorkDir, tables: list[str]) -> Iterator[tuple[str, str | None]]:
    """(image URL, referring page) of every image `tables` reference that has no outcome yet,
    partition by partition (every table here is partitioned by image URL, so the done URLs held
    at once are one partition's); each URL once."""
    for p in range(work.n_partitions):
        done = _done_in(work, p)
        for table in tables:
            for row in work.iter_rows(table, p, columns=["image_url", "page_url"], batch_size=4096):
                url = row["image_url"]
                if url not in done:
                    done.add(url)
                    yield url, row["page_url"]


def _done_in(work: WorkDir, partition: int) -> set[str]:
    """Image URLs of a partition that have an outcome: an images/ row or a crawl/ reject."""
    done = {r["image_url"] for r in work.iter_rows("images", partition, columns=["image_url"], batch_size=4096)}
    for r in work.iter_rows("rejected", partition, columns=["reason", "image_url"], batch_size=4096):
        if r["image_url"] and r["reason"].startswith("crawl/"):
            done.add(r["image_url"])
    return done


def pending_by_bucket(work: WorkDir, tables: list[str], n_buckets: int = N_BUCKETS) -> Counter[int]:
    """How many pending images each host bucket holds."""
    return Counter(host_share(url, n_buckets) for url, _ in pending_images(work, tables))


def plan_units(counts: Counter[int], n_units: int) -> list[list[int]]:
    """The buckets of `counts` packed into at most `n_units` units of about equal work: the
    largest bucket first, each into the unit with the fewest images so far. Empty units are
    left out; each unit's buckets are sorted."""
    units: list[list[int]] = [[] for _ in range(max(1, n_units))]
    heap = [(0, i) for i in range(len(units))]
    for bucket, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        load, i = heapq.heappop(heap)
        units[i].append(bucket)
        heapq.heappush(heap, (load + n, i))
    return [sorted(u) for u in units if u]


def unit_configs(cfg: ImageFetchConfig, units: list[list[int]], *, split_concurrency: bool) -> list[ImageFetchConfig]:
    """One fetcher config per unit. Units running side by side on one machine split
    `concurrency` among them; on Ray each task has the whole of it (it is per task)."""
    n = len(units)
    concurrency = max(1, -(-cfg.concurrency // n)) if split_concurrency else cfg.concurrency
    return [cfg.replace(share=[*u, N_BUCKETS], concurrency=concurrency) for u in units]
