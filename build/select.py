"""`lait select`: score once, select many. New shards from the pool of a built work directory.

`lait build` keeps, in `pool/`, every picture that passed its grouping, deduplication and text
rules, with its planned sample and uid, before the score thresholds. A selection reads only
that: it cuts by `min_score`, `top_fraction` and a DataComp subset file of uids, and writes the
chosen samples as shards into a folder of its own, as `lait build` would with the same
thresholds (the same samples, keys and bytes). No model runs, nothing is regrouped, and the
work directory is only read.

The folder gets `NNNNN.tar`, `NNNNN.parquet`, `NNNNN_stats.json`, `sizes.json`, `stats.json` and
`uids.npy` (what was selected, in DataComp's subset format: `--uids OUT/uids.npy` selects it
again). Its `_select/` holds the selection's plan and task markers, so an interrupted selection
resumes; a different selection into the same folder needs `--overwrite`, and `--force` redoes
the same one.

The selection holds the lock of its folder (`OUT/_lock`), and the work directory's: shared, so
that several selections run side by side from one pool, while a selection and a command that
writes the work directory (`lait build --force` replacing the pool) keep each other out, the
second one exiting 2 with one line that names the first; exclusively when the folder lies
inside the work directory. It refuses a pool whose build is out of date (`images_ok/`, `scored/`, ... changed
since `lait build`: the pool's rows point into them), and checks when it ends that none of what
it read changed while it ran (on object storage two commands started within a second can both
take the lock).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lait import storage
from lait.build.aggregate import pool_rows, score_cut, write_plan
from lait.build.config import SelectConfig
from lait.build.curate import load_all
from lait.build.pipeline import Reports, stage_counters
from lait.build.sample import UID_DTYPE, array_to_uids
from lait.build.shards import ShardStage, faces_line, finish_shard_dir, shard_files, write_stats, written_members
from lait.config import ConfigError
from lait.drivers import open_work_dir, run_stage
from lait.fingerprint import Fingerprint, global_fingerprint
from lait.lock import LOCAL_FILE, REMOTE_FILE, locked_output
from lait.stage import RunReport, run_global_step
from lait.workdir import WorkDir
from lait.writers import atomic_write_json

log = logging.getLogger(__name__)

STATE_DIR = "_select"
SELECTION_FILE = "selection.json"
PLAN_STAGE = "select_plan"
# What a selection writes into its folder (and --overwrite removes); nothing else is touched.
OUTPUT_NAME = re.compile(r"(\d{5}\.(tar|parquet)|\d{5}_stats\.json|sizes\.json|stats\.json|uids\.npy|README\.md)")


def own_name(name: str) -> bool:
    """The selection's state and the folder's lock files (`_lock`, `_lock.json`, ...)."""
    return name == STATE_DIR or name in (LOCAL_FILE, REMOTE_FILE) or name.startswith("_lock.")


@dataclass
class SelectResult(Reports):
    """What a selection did: the shard pass's report and the folder's stats."""

    def summary(self) -> str:
        lines = [r.summary() for r in self.reports]
        if self.stats:
            s = self.stats
            lines.append(f"select: {s['samples']} of {s['pool']} pool samples in {s['shards']} shards "
                         f"({s['shard_bytes'] / 1e6:.1f} MB of sample files, before tar headers) in {s['out']}")
            faces = faces_line(s.get("counters") or {}, s["samples"], "select")
            if faces:
                lines.append(faces)
            if "eval_images" in s:
                lines.append(f"select: {s['eval_overlap']} pool samples dropped as copies of the {s['eval_images']} "
                             f"evaluation images (build/eval_overlap, in {s['out']}/_select/rejected/)")
            if s.get("recipe"):
                from lait.build.curate import describe_steps

                lines += describe_steps(s["recipe"]["steps"])
            if s.get("uids_not_in_pool"):
                lines.append(f"select: {s['uids_not_in_pool']} uids of {s['uids_file']} are not in the pool")
        return "\n".join(lines)


# -- uid files ---------------------------------------------------------------------------------
def read_uids(path: str) -> list[str]:
    """The hex uids of a subset file: DataComp's .npy (a u8,u8 structured array) or a text file
    with one 32-digit hex uid a line."""
    raw = storage.read_bytes(storage.location(path))
    if raw.startswith(b"\x93NUMPY"):
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
        if arr.dtype != UID_DTYPE:
            raise ConfigError(f"{path}: a DataComp subset file holds dtype {UID_DTYPE}, not {arr.dtype}")
        return array_to_uids(arr)
    try:
        uids = [line.strip().lower() for line in raw.decode("utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: neither a .npy subset file nor a text file of uids") from None
    bad = [u for u in uids if not re.fullmatch(r"[0-9a-f]{32}", u)]
    if bad:
        raise ConfigError(f"{path}: not a uid (32 hex digits): {bad[0]!r}")
    return uids


# -- the selection -----------------------------------------------------------------------------
def choose(work: WorkDir, cfg: SelectConfig, wanted: list[str] | None,
           state: WorkDir | None = None) -> tuple[pa.Array, dict[str, int]]:
    """The uids of the pool the selection keeps, and its counts (pool, not in pool, evaluation
    overlaps). The pool images that `--exclude-eval` drops go to `state`'s `rejected/`."""
    columns = ["uid", "image_url", "score"]
    if cfg.recipe:
        from lait.build.curate import POOL_COLUMNS

        columns = list(dict.fromkeys(columns + POOL_COLUMNS))
    if cfg.exclude_eval:
        columns += ["page_url", "phash", "src_file", "row_group", "row_index"]
    # A recipe and --exclude-eval both read page_url: a column named twice is an error to Arrow.
    pool = work.read("pool", columns=list(dict.fromkeys(columns)))
    counts = {"pool": pool.num_rows}
    if wanted is not None:
        wanted_arr = pa.array(sorted(set(wanted)), pa.string())
        counts["uids_requested"] = len(wanted_arr)
        counts["uids_not_in_pool"] = len(wanted_arr) - pc.sum(pc.is_in(wanted_arr, value_set=pool["uid"])).as_py()
        pool = pool.filter(pc.is_in(pool["uid"], value_set=wanted_arr))
    if cfg.exclude_eval:
        pool, counts["eval_images"], counts["eval_overlap"] = exclude_eval(work, pool, cfg, state)
    if cfg.recipe:
        pool, counts["recipe"] = apply_recipes(work, pool, cfg.recipe, state)
    kept, _, _ = score_cut(pool["score"].to_numpy(), pool["image_url"], cfg.min_score, cfg.top_fraction)
    return pool["uid"].take(pa.array(kept, pa.int64())), counts


def exclude_eval(work: WorkDir, pool: pa.Table, cfg: SelectConfig,
                 state: WorkDir | None) -> tuple[pa.Table, int, int]:
    """The pool without the pictures of the `--exclude-eval` set (`lait.build.decon`), each of
    those recorded as `build/eval_overlap` in `state`'s `rejected/`; the set's size and the
    number dropped. The pool holds a picture's kept image only: a copy that the build grouped
    with it is judged by that image."""
    from lait.build.decon import detail_of, find_overlaps, load_eval_set
    from lait.build.pixels import read_thumbnails
    from lait.parts import PartitionedWriter

    eval_set = load_eval_set(cfg.exclude_eval, cfg.exclude_eval_split, cfg.exclude_eval_root)
    places = list(zip(pool["src_file"].to_pylist(), pool["row_group"].to_pylist(), pool["row_index"].to_pylist()))
    phashes = np.array([int(h, 16) for h in pool["phash"].to_pylist()], np.uint64)
    found = find_overlaps(eval_set, phashes, lambda idx: read_thumbnails(work, {i: places[i] for i in idx}, detail_of),
                          cfg.eval_max_phash, cfg.eval_max_diff)
    if state is not None and found:
        urls, pages = pool["image_url"].to_pylist(), pool["page_url"].to_pylist()
        with PartitionedWriter(state, PLAN_STAGE) as parts:
            for i in sorted(found):
                parts.reject("build/eval_overlap", 0, image_url=urls[i], page_url=pages[i], detail=found[i].detail())
    keep = np.ones(pool.num_rows, bool)
    keep[list(found)] = False
    return pool.filter(pa.array(keep)), len(eval_set), len(found)


def apply_recipes(work: WorkDir, pool: pa.Table, names: list[str],
                  state: WorkDir | None) -> tuple[pa.Table, dict[str, Any]]:
    """The pool less what the recipes' steps remove (`lait.build.curate`), each removed sample
    recorded in `state`'s `rejected/` with its step's reason; and the steps' counts."""
    from lait.build.curate import Pool, apply
    from lait.parts import PartitionedWriter

    cur = apply(load_all(names), Pool(pool, lambda idx: image_embeddings(work, pool, idx)))
    if state is not None and cur.removed:
        urls, pages = pool["image_url"].to_pylist(), pool["page_url"].to_pylist()
        with PartitionedWriter(state, PLAN_STAGE) as parts:
            for i in sorted(cur.removed):
                reason, detail = cur.removed[i]
                parts.reject(reason, 0, image_url=urls[i], page_url=pages[i], detail=detail)
    return pool.filter(pa.array(cur.keep)), {"recipes": list(names), "steps": cur.steps,
                                             "removed": len(cur.removed)}


def image_embeddings(work: WorkDir, pool: pa.Table, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stage 4's image embeddings of the pool rows `idx`: which have one, and theirs (fp16)."""
    from lait.arrays import stack_embs

    if not work.part_files("image_embs"):
        return np.zeros(len(idx), bool), np.zeros((0, 0), np.float16)
    embs = work.read("image_embs", columns=["image_url", "dim", "emb"])
    row_of = {u: r for r, u in enumerate(embs["image_url"].to_pylist())}
    urls = pool["image_url"].to_pylist()
    rows = [row_of.get(urls[i], -1) for i in idx]
    have = np.array([r >= 0 for r in rows], bool)
    found = pa.array([r for r in rows if r >= 0], pa.int64())
    return have, stack_embs(embs.take(found))


def source_inputs(work: WorkDir, embeddings: bool = False) -> dict[str, Any]:
    """What a selection reads from the work directory, as `lait.fingerprint` lists it: the pool
    (and the build's own record of its inputs) and the tables the shard writer reads bytes and
    region arrays from, every part with its size and the digest of the task that wrote it; and
    `image_embs/` when a recipe reads embeddings (SemDeDup)."""
    from lait.build.pipeline import build_record

    build = (build_record(work) or {}).get("fingerprint")
    tables = ("pool", "images_ok", "regions", "region_labels") + (("image_embs",) if embeddings else ())
    listed = global_fingerprint(work, "select", {}, tables).inputs
    return {"build": (build or {}).get("digest"),
            "inputs": {t: [list(p) for p in parts] for t, parts in listed.items()}}


def check_build_current(work: WorkDir) -> None:
    """A ConfigError when the tables the build read changed since it made the pool: its rows
    point into `images_ok/` by file and row, so a pool older than them would select wrong bytes."""
    from lait.build.pipeline import INPUT_TABLES, build_record

    old = (build_record(work) or {}).get("fingerprint")
    if not isinstance(old, dict) or "inputs" not in old:
        raise ConfigError(f"{work.root}: the pool was made by an older lait build; run `lait build` again first")
    now = global_fingerprint(work, "build", {}, INPUT_TABLES).inputs
    if old["inputs"] != {t: [list(p) for p in parts] for t, parts in now.items()}:
        changed = sorted(t for t in set(old["inputs"]) | set(now)
                         if old["inputs"].get(t) != [list(p) for p in now.get(t, [])])
        raise ConfigError(f"{work.root}: {', '.join(changed)} changed since `lait build` made the pool; "
                          f"run `lait build` again first (`lait status` says what changed)")


def fingerprint(work: WorkDir, cfg: SelectConfig, source: dict[str, Any]) -> str:
    uids_digest = hashlib.sha256(storage.read_bytes(storage.location(cfg.uids))).hexdigest() if cfg.uids else None
    eval_digest = None
    if cfg.exclude_eval:
        from lait.build.decon import load_eval_set

        eval_digest = load_eval_set(cfg.exclude_eval, cfg.exclude_eval_split, cfg.exclude_eval_root).digest
    what = {"source": work.url, "config": cfg.content(), "uids_sha256": uids_digest, "read": source,
            "eval_set": eval_digest}
    if cfg.recipe:  # the steps with their settings and the digests of the files they read
        what["recipe"] = [step.content() for step in load_all(cfg.recipe)]
    blob = json.dumps(what, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def prepare_out(out: storage.Location, state: WorkDir, fp: str, overwrite: bool, force: bool = False) -> None:
    """Make the folder ready for this selection: kept as it is when an earlier run of the same
    selection left it (a resume), emptied when it starts afresh (always with `force`)."""
    marker = state.root / SELECTION_FILE
    earlier = json.loads(storage.read_text(marker))["fingerprint"] if storage.exists(marker) else None
    if earlier == fp and not force:
        return
    if earlier == fp:
        overwrite = True  # --force: the same selection, redone from its plan on
    ours = [p for p in storage.list_dir(out) if OUTPUT_NAME.fullmatch(p.name)]
    others = [p for p in storage.list_dir(out) if not OUTPUT_NAME.fullmatch(p.name) and not own_name(p.name)]
    if (ours or earlier is not None) and not overwrite:
        what = "another selection" if earlier is not None else "shards"
        raise ConfigError(f"{out} already holds {what}; pass --overwrite to replace it, or choose another --out")
    if others and earlier is None and not ours:
        raise ConfigError(f"{out} is not empty ({others[0].name}, ...); choose an empty or new folder for --out")
    for p in ours:
        storage.remove(p)
    storage.remove_tree(state.root)
    state.init()
    atomic_write_json(marker, {"fingerprint": fp})


def select(cfg: SelectConfig) -> SelectResult:
    """Write the selection `cfg` describes from `cfg.work`'s pool into `cfg.out`, through the one
    launcher (`SelectStage`)."""
    stage = SelectStage(cfg)
    report = run_stage(stage, cfg, "select")
    return SelectResult([report], stats=stage.stats)


class SelectStage(ShardStage):
    """`lait select` as `lait.drivers.run_stage` runs it: the shard pass (`ShardStage`, whose name,
    settings and markers it keeps) over the selection's plan in `OUT/_select/`. Its `workspace`
    is that folder, locked with the work directory it reads; `preflight` checks the pool, makes
    the folder ready (`prepare_out`) and plans once; `after_steps` checks that nothing it read
    changed and writes the folder's `sizes.json`, `uids.npy` and `stats.json` (`stats`)."""

    def __init__(self, cfg: SelectConfig):
        super().__init__(cfg.image_options(), cfg.regions, out=str(storage.location(cfg.out)))
        self.cfg = cfg
        self.stats: dict[str, Any] = {}
        self.read: dict[str, Any] = {}
        self.counts: dict[str, Any] = {}
        self.work: WorkDir | None = None  # the work directory read, once `workspace` opened it
        self.embeddings = False  # whether a recipe's step reads stage 4's image embeddings (SemDeDup)

    def __getstate__(self) -> dict[str, Any]:  # sent to workers as the shard pass
        return {**self.__dict__, "work": None}

    @contextlib.contextmanager
    def workspace(self, cfg: Any, command: str) -> Iterator[WorkDir]:
        work = open_work_dir(self.cfg.work, initialized=True)
        if not work.part_files("pool") or not work.is_done("build_plan", 0):
            raise ConfigError(f"{work.root} has no pool/ yet: run `lait build` on it first (it scores nothing)")
        out = storage.location(self.cfg.out)
        self.work, self.source = work, work.url
        # The folder is made by its lock, once the work directory's is held: a selection refused
        # because a build holds the work directory leaves nothing behind.
        with locked_output(out, "lait select", reads=work):
            yield WorkDir(out / STATE_DIR, n_partitions=1)

    def preflight(self, state: WorkDir) -> list[str]:
        cfg, work = self.cfg, self.work
        assert work is not None
        check_build_current(work)
        self.embeddings = bool(cfg.recipe) and any(step.rule == "semdedup" for step in load_all(cfg.recipe))
        self.read = source_inputs(work, self.embeddings)
        wanted = read_uids(cfg.uids) if cfg.uids else None
        selection = fingerprint(work, cfg, self.read)
        prepare_out(storage.location(cfg.out), state, selection, cfg.overwrite, cfg.force)

        def plan() -> dict[str, Any]:
            state.remove_parts("rejected", PLAN_STAGE)  # an interrupted plan's
            chosen, counts = choose(work, cfg, wanted, state)
            counts["selected"] = len(chosen)
            counts["shards_planned"] = write_plan(state, pool_rows(work, chosen), cfg.samples_per_shard, PLAN_STAGE)
            return {"stage": PLAN_STAGE, "partition": 0, "counts": counts}

        # The selection's digest stands for everything it reads (`fingerprint`); a new one empties `state`.
        run_global_step(state, Fingerprint(PLAN_STAGE, 1, {"selection": selection}, {}), plan, label="select")
        self.counts = state.markers(PLAN_STAGE)[0]["counts"]
        log.info("select: %d of %d pool samples chosen", self.counts["selected"], self.counts["pool"])
        return []

    def after_steps(self, state: WorkDir, report: RunReport, run: Callable[..., RunReport]) -> list[RunReport]:
        cfg, work, out = self.cfg, self.work, storage.location(self.cfg.out)
        assert work is not None
        if source_inputs(work, self.embeddings) != self.read:
            # A build or a filter rewrote what the shards were cut from while they were written.
            storage.remove(state.root / SELECTION_FILE)
            raise RuntimeError(f"select: {work.root} changed while the selection ran (a `lait build` or an "
                               f"earlier stage rewrote it); run `lait select` again, with --overwrite")
        sizes = finish_shard_dir(out, cfg.image_options().encode_format, written_members(state, self.name))
        counters = stage_counters(state, (self.name,))
        shard_bytes = int(counters.get("build/shard_bytes", 0))
        self.stats = {"samples": sum(sizes.values()), "shards": len(shard_files(out)), "shard_bytes": shard_bytes,
                      "out": str(out), "source": work.url, **self.counts, "uids_file": cfg.uids or None,
                      "exclude_eval": {"source": cfg.exclude_eval, "splits": list(cfg.exclude_eval_split),
                                       "root": cfg.exclude_eval_root or None} if cfg.exclude_eval else None,
                      "config": cfg.content(), "counters": dict(sorted(counters.items()))}
        write_stats(out, self.stats)
        return []
