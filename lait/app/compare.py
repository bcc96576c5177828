"""`lait compare`: judge curation recipes by training on what each selects (DataComp's loop).

The app layer wires two stages that never meet otherwise: `lait.build.select` cuts each
recipe's selection from the pool, `lait.train.compare` trains the same budget on it and
evaluates retrieval; the demo web's ground truth (`lait.testkit.groundtruth`) counts the wrong
pairs each selection holds.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lait.config import Config, ConfigError, setting

log = logging.getLogger(__name__)

DESCRIPTION = """\
Judge curation recipes the way DataComp does: by training on what each one selects.

For each --recipe, select from WORK's pool with that recipe into OUT/selections/RECIPE/ (WORK is
only read), train the same budget on the selection (same model, steps, batch size, initialisation
and seed; the bundled ImageBERT trainer, budget train/configs/compare-tiny.yaml unless --budget
names a copy), and evaluate retrieval on the --eval set. Prints one table (recipe, samples, wrong
pairs where a ground truth is known, R@1/5/10 image->text and text->image) and writes the same
as JSON to OUT/compare.json (--json prints the JSON on stdout and the table on stderr).

With --seeds N each recipe trains N times (seeds --seed .. --seed+N-1: each seeds the
initialisation and the data order; the selection is the same) and the table gives the mean and
the spread (sample standard deviation) over seeds. Resumable: every (recipe, seed) is
fingerprinted by its budget, seed, selection shards and evaluation set, and a finished one is not
trained again.

The evaluation set must be disjoint from training: with a Karpathy-style JSON every selection
first drops the pool pictures that copy one of its images (lait select --exclude-eval).
"""

EPILOG = """\
examples:
  lait demo --out demo/ --eval-pages 100
  lait compare demo/work --recipe clip-top30 --recipe random-30 --recipe all \\
      --eval demo/eval/karpathy.json --seeds 3 --out demo/compare
  lait compare work/ --recipe datacomp-basic --recipe metaclip --eval flickr8k/karpathy.json \\
      --eval-split test --budget my-budget.yaml --budget-set stages.0.steps=2000
"""


@dataclass
class CompareConfig(Config):
    """`lait compare`: select with each recipe, train the same budget on each, evaluate retrieval."""

    section = "compare"

    work: str = setting("", "work directory built by `lait build` (its pool/ is read, never written)",
                        positional=True)
    recipe: list[str] = setting([], "a curation recipe to compare (a shipped name or a YAML file); repeat for each",
                                metavar="NAME|FILE")
    eval: str = setting("", "evaluation set: a shard folder (one caption per image) or a Karpathy-style JSON",
                        metavar="DIR|KARPATHY.json")
    eval_split: str = setting("test", "split of the Karpathy-style JSON")
    eval_image_root: str = setting("", "folder the JSON's image paths are relative to (default: the JSON's)",
                                   metavar="DIR")
    eval_mode: str = setting("embedding", "how retrieval ranks: the embeddings' cosine, ITM re-ranking their "
                             "top 20, or ITM on every pair", choices=["embedding", "shortlist", "full"])
    seeds: int = setting(1, "train each selection with this many seeds and give the mean and spread")
    seed: int = setting(0, "the first seed")
    out: str = setting("compare", "folder for the selections, the runs and compare.json")
    budget: str = setting("", "the training budget: a pretraining config YAML (default: "
                          "train/configs/compare-tiny.yaml); its stages' shards are each selection's",
                          metavar="YAML")
    budget_set: list[str] = setting([], "change a setting of the budget: stages.0.steps=600", metavar="KEY=VALUE")
    ground_truth: str = setting("", "ground truth of a local web (lait demo's OUT/ground_truth.json): adds the wrong "
                                "pairs of each selection; default: ground_truth.json beside WORK when there is one",
                                metavar="JSON")
    exclude_eval: bool = setting(True, "drop the pool pictures that copy an image of a Karpathy-style --eval set")
    json: bool = setting(False, "print the JSON on stdout (the table goes to stderr)", run=True)
    workers: int = setting(0, "worker processes of the selections (0: one per CPU core)", run=True)
    cpu_threads: int | None = setting(None, "torch threads of training and evaluation", run=True)
    progress: bool = setting(True, "show progress bars on a terminal", run=True)

    def validate(self) -> None:
        self.check_choices()
        if not self.work:
            raise ConfigError("a work directory is required")
        if not self.recipe:
            raise ConfigError("--recipe is required, once per recipe to compare")
        if not self.eval:
            raise ConfigError("--eval is required: a shard folder or a Karpathy-style JSON")
        if self.seeds < 1:
            raise ConfigError("--seeds must be >= 1")
        names = [recipe_label(r) for r in self.recipe]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ConfigError(f"--recipe {dup[0]} is given twice (or two recipe files share its name)")


def recipe_label(recipe: str) -> str:
    return Path(recipe).stem if recipe.endswith((".yaml", ".yml")) else recipe


def truth_file(cfg: CompareConfig) -> Path | None:
    if cfg.ground_truth:
        if not Path(cfg.ground_truth).is_file():
            raise ConfigError(f"--ground-truth {cfg.ground_truth}: not found")
        return Path(cfg.ground_truth)
    beside = Path(cfg.work).resolve().parent / "ground_truth.json"
    return beside if "://" not in cfg.work and beside.is_file() else None


# The settings of WORK's last clean and build that decide which wrong pairs its pool can hold.
POOL_SETTINGS = {"clean": ("sources", "rules_off", "languages"),
                 "build": ("max_images_per_text", "max_texts_per_image", "max_pages_per_image")}


def pool_settings(work: str) -> dict[str, Any] | None:
    """The caption settings WORK's pool was built with (its `_configs/clean.yaml` and
    `build.yaml`), so that the table says when it judged a raw pool (`lait demo --raw-pool`);
    None where they cannot be read."""
    import yaml

    from lait import storage

    out: dict[str, Any] = {}
    for command, keys in POOL_SETTINGS.items():
        path = storage.location(work) / "_configs" / f"{command}.yaml"
        try:
            if not storage.exists(path):
                return None
            data = yaml.safe_load(storage.read_text(path)) or {}
        except (OSError, ValueError, yaml.YAMLError) as exc:
            log.warning("compare: cannot read %s: %s", path, exc)
            return None
        out[command] = {k: data.get(k) for k in keys}
    return out


def select_recipe(cfg: CompareConfig, recipe: str, out: Path) -> dict[str, Any]:
    """The recipe's selection in `out` (resumed or replaced as `lait select` does); its stats."""
    from lait.build.config import SelectConfig
    from lait.build.select import select

    sel = SelectConfig(work=cfg.work, out=str(out), recipe=[recipe], overwrite=True, workers=cfg.workers,
                       progress=cfg.progress)
    if cfg.exclude_eval and cfg.eval.endswith(".json"):
        sel.exclude_eval, sel.exclude_eval_split = cfg.eval, [cfg.eval_split]
        sel.exclude_eval_root = cfg.eval_image_root
    sel.validate()
    result = select(sel)
    print(result.summary(), file=sys.stderr)
    if not result.ok:
        raise RuntimeError(f"the selection of {recipe} failed (see above)")
    return result.stats


def compare(cfg: CompareConfig) -> dict[str, Any]:
    """Every recipe selected, trained and evaluated; the comparison as a JSON-ready dict."""
    from lait.train.compare import DEFAULT_BUDGET, EvalSpec, summarise, train_and_evaluate

    spec = EvalSpec(cfg.eval, cfg.eval_split, cfg.eval_image_root, cfg.eval_mode)
    spec.check()
    eval_digest = spec.digest()
    truth_path = truth_file(cfg)
    truth = json.loads(truth_path.read_text()) if truth_path else None
    out = Path(cfg.out)
    seeds = list(range(cfg.seed, cfg.seed + cfg.seeds))
    rows = []
    for recipe in cfg.recipe:
        label = recipe_label(recipe)
        sel_dir = out / "selections" / label
        row: dict[str, Any] = {"recipe": label, "selection": str(sel_dir)}
        rows.append(row)
        try:
            stats = select_recipe(cfg, recipe, sel_dir)
            row.update(samples=stats["samples"], pool=stats["pool"], eval_overlap=stats.get("eval_overlap"))
            if not stats["samples"]:
                raise ValueError(f"the recipe selected none of the {stats['pool']} pool samples: nothing to train on")
            if truth is not None:
                from lait.testkit.groundtruth import evaluate

                row["wrong_pairs"] = evaluate(sel_dir, truth)["wrong"]
            cells = []
            for seed in seeds:
                cell = train_and_evaluate(str(sel_dir), out / "runs" / label / f"seed-{seed}", seed, spec,
                                          cfg.budget, cfg.budget_set, eval_digest, cfg.cpu_threads, cfg.progress)
                print(f"compare: {label} seed {seed}: "
                      + (f"trained {cell['steps']} steps in {cell['train_seconds']:.0f} s" if cell["trained"]
                         else "finished earlier, not trained again")
                      + f"; i2t R@1 {100 * cell['i2t_r1']:.1f}, t2i R@1 {100 * cell['t2i_r1']:.1f}",
                      file=sys.stderr, flush=True)
                cells.append(cell)
            row["runs"] = cells
            row["metrics"] = summarise(cells)
        except (ConfigError, RuntimeError, ValueError, OSError) as exc:
            # One recipe that cannot be judged (an empty selection, say) does not stop the others.
            row["error"] = f"{type(exc).__name__}: {exc}"
            log.error("compare: %s: %s", label, row["error"])
    result = {"work": cfg.work, "eval": {"source": cfg.eval, "split": cfg.eval_split, "mode": cfg.eval_mode,
                                         "digest": eval_digest},
              "budget": str(cfg.budget or DEFAULT_BUDGET), "budget_set": list(cfg.budget_set), "seeds": seeds,
              "ground_truth": str(truth_path) if truth_path else None, "pool_settings": pool_settings(cfg.work),
              "recipes": rows}
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "compare.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(out / "compare.json")
    return result


def format_table(result: dict[str, Any]) -> str:
    """The comparison as a text table: R@K in per cent, `mean ± spread` over several seeds."""
    from lait.train.compare import METRICS

    several = len(result["seeds"]) > 1
    has_truth = result.get("ground_truth") is not None
    head = ["recipe", "samples"] + (["wrong pairs"] if has_truth else []) + [
        f"{'i2t' if m.startswith('i2t') else 't2i'} R@{m.split('_r')[1]}" for m in METRICS]
    lines, errors = [], []
    for row in result["recipes"]:
        cells = [row["recipe"], str(row.get("samples", "-"))] + ([str(row.get("wrong_pairs", "-"))] if has_truth else [])
        if "error" in row:
            lines.append(cells + ["-"] * len(METRICS))
            errors.append(f"{row['recipe']}: {row['error']}")
            continue
        for m in METRICS:
            s = row["metrics"][m]
            cells.append(f"{100 * s['mean']:.1f} ± {100 * s['std']:.1f}" if several else f"{100 * s['mean']:.1f}")
        lines.append(cells)
    widths = [max(len(r[i]) for r in [head] + lines) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    out = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines]
    ev = result["eval"]
    note = (f"R@K in % on {ev['source']}" + (f" (split {ev['split']})" if ev["source"].endswith(".json") else "")
            + f", {ev['mode']} mode; seeds {', '.join(map(str, result['seeds']))}"
            + ("; mean ± sample standard deviation over seeds" if several else ""))
    pool = (result.get("pool_settings") or {}).get("clean") or {}
    if pool.get("rules_off"):
        note += (f"\npool: built with stage-3 rules off ({', '.join(pool['rules_off'])}) from "
                 f"{', '.join(pool.get('sources') or [])} texts: a raw pool, its wrong pairs are on purpose")
    return "\n".join(out + [note] + [f"not judged: {e}" for e in errors])


def run_compare(cfg: CompareConfig) -> int:
    result = compare(cfg)
    table = format_table(result)
    if cfg.json:
        print(table, file=sys.stderr)
        print(json.dumps(result, indent=2))
    else:
        print(table)
    print(f"compare: the table as JSON in {Path(cfg.out) / 'compare.json'}", file=sys.stderr)
    return 1 if any("error" in r for r in result["recipes"]) else 0


def register(sub) -> None:
    """Add `lait compare`."""
    from lait.app.commands import add_config_command

    add_config_command(sub, "compare", CompareConfig, run_compare,
                       help="judge curation recipes by training the same budget on each selection",
                       description=DESCRIPTION, epilog=EPILOG)
