"""Curation recipes of `lait select` (lait.build.curate): each recipe's rule, stated on a pool
built for it, and a recipe run through `lait select` with its removals recorded."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401
import pytest

from lait.build.curate import Pool, apply, builtin_recipes, load, load_all
from lait.build.metaclip import Matcher, balance, keep_probability, match_all, uid_keys
from lait.build.semdedup import semdedup
from lait.config import ConfigError


def uid(i: int) -> str:
    return hashlib.sha256(f"pair-{i}".encode()).hexdigest()[:32]


def pool_of(rows: list[dict]) -> pa.Table:
    base = {"lang": "en", "width": 640, "height": 480, "score": 0.3, "caption": "a photo of a dog"}
    full = [{**base, "uid": uid(i), "image_url": f"https://e.org/{i}.jpg", "page_url": "https://e.org/",
             **r} for i, r in enumerate(rows)]
    return pa.table({k: [r[k] for r in full] for k in ["uid", "image_url", "page_url", "caption", "lang", "score",
                                                       "width", "height"]})


def run(recipe: str | list[str], table: pa.Table, embeddings=None):
    names = [recipe] if isinstance(recipe, str) else recipe
    return apply(load_all(names), Pool(table, embeddings))


def test_every_shipped_recipe_loads_and_the_required_ones_are_there():
    from lait.app.cli import build_parser

    shipped = builtin_recipes()
    assert {"datacomp-basic", "datacomp-text", "clip-top30", "laion-0.28", "metaclip", "semdedup"} <= set(shipped)
    help_text = build_parser()._subparsers._group_actions[0].choices["select"].format_help()
    for name in shipped:
        assert load(name) and shipped[name]
        assert f"\n  {name} " in help_text  # `lait select --help` lists it


def test_datacomp_basic_keeps_exactly_what_its_published_rule_keeps():
    rows = []
    for lang in ("en", "de", None):
        for caption in ("two words", "three wee words", "a b c", "a bb cc", "longer caption here\twith a tab"):
            for w, h in ((200, 200), (199, 400), (600, 200), (601, 200), (200, 601), (1000, 800)):
                rows.append({"lang": lang, "caption": caption, "width": w, "height": h})
    table = pool_of(rows)
    cur = run("datacomp-basic", table)

    def published(r):  # mlfoundations/datacomp baselines/apply_filter.py, basic filter
        words, chars = len(r["caption"].split()), len(r["caption"])
        side, ratio = min(r["width"], r["height"]), max(r["width"], r["height"]) / min(r["width"], r["height"])
        return r["lang"] == "en" and words > 2 and chars > 5 and side >= 200 and ratio <= 3.0

    expected = np.array([published(r) for r in rows])
    assert 0 < expected.sum() < len(rows)
    assert np.array_equal(cur.keep, expected)
    # Each removed sample carries the reason of the first rule it fails.
    assert cur.removed[rows.index({"lang": "de", "caption": "three wee words", "width": 1000, "height": 800})][0] \
        == "select/language"
    assert cur.removed[rows.index({"lang": "en", "caption": "two words", "width": 1000, "height": 800})][0] \
        == "select/caption_words"
    assert cur.removed[rows.index({"lang": "en", "caption": "a b c", "width": 1000, "height": 800})][0] \
        == "select/caption_chars"
    assert cur.removed[rows.index({"lang": "en", "caption": "a bb cc", "width": 199, "height": 400})][0] \
        == "select/min_side"
    assert cur.removed[rows.index({"lang": "en", "caption": "a bb cc", "width": 601, "height": 200})][0] \
        == "select/aspect"
    assert sum(s["removed"] for s in cur.steps) == len(cur.removed) == (~expected).sum()
    assert cur.steps[0]["in"] == len(rows) and cur.steps[-1]["in"] + 0 == cur.steps[-2]["in"] - cur.steps[-2]["removed"]


def test_datacomp_text_keeps_english_captions_that_name_an_imagenet_class():
    captions = {"my goldfish in its bowl": True, "A Great White Shark, seen from a boat.": True,
                "gold fish in a bowl": False, "great sharks": False, "sunset over the hills": False,
                "tiger shark.": True}
    rows = [{"caption": c} for c in captions] + [{"caption": "my goldfish in its bowl", "lang": "fr"}]
    cur = run("datacomp-text", pool_of(rows))
    assert cur.keep.tolist() == list(captions.values()) + [False]
    assert {why for why, _ in cur.removed.values()} == {"select/no_entity", "select/language"}


def test_clip_top30_keeps_the_top_30_percent_and_laion_keeps_scores_at_or_above_028():
    scores = np.linspace(0.1, 0.4, 20).round(4).tolist() + [0.28]
    table = pool_of([{"score": s} for s in scores])
    top = run("clip-top30", table)
    n = math.ceil(0.3 * len(scores))
    assert top.keep.sum() == n and min(np.array(scores)[top.keep]) >= sorted(scores, reverse=True)[n - 1]
    laion = run("laion-0.28", table)
    assert np.array_equal(laion.keep, np.array(scores) >= 0.28)
    assert {why for why, _ in laion.removed.values()} == {"select/min_score"}


def test_random_30_draws_30_percent_blind_to_score_the_same_for_any_order_and_all_keeps_everything(tmp_path):
    rng = np.random.default_rng(0)
    scores = rng.random(400)
    table = pool_of([{"score": float(s)} for s in scores])
    cur = run("random-30", table)
    assert cur.keep.sum() == math.ceil(0.3 * len(scores))
    assert {why for why, _ in cur.removed.values()} == {"select/random_fraction"}
    # Blind to the score: the drawn ones' scores look like the pool's, unlike clip-top30's.
    assert abs(scores[cur.keep].mean() - scores.mean()) < 0.06
    assert scores[cur.keep].mean() < scores[run("clip-top30", table).keep].mean() - 0.2
    # The draw belongs to the uids, not to the pool's row order.
    perm = rng.permutation(len(scores))
    again = run("random-30", table.take(pa.array(perm)))
    assert set(np.array(table["uid"])[cur.keep]) == set(np.array(table["uid"])[perm][again.keep])
    # Another seed draws another set of the same size.
    other = tmp_path / "random-30-seed1.yaml"
    other.write_text("steps:\n  - {rule: random_fraction, fraction: 0.3, seed: 1}\n")
    drawn = run(str(other), table).keep
    assert drawn.sum() == cur.keep.sum() and not np.array_equal(drawn, cur.keep)
    everything = run("all", table)
    assert everything.keep.all() and not everything.removed


def test_an_intersection_keeps_what_every_recipe_keeps_and_ranks_the_fraction_over_the_pool():
    rng = np.random.default_rng(0)
    rows = [{"score": float(s), "width": int(w)} for s, w in zip(rng.random(200), rng.choice([100, 300], 200))]
    table = pool_of(rows)
    both = run("datacomp-basic-clip-top30", table)
    assert np.array_equal(both.keep, run("datacomp-basic", table).keep & run("clip-top30", table).keep)
    assert np.array_equal(both.keep, run(["datacomp-basic", "clip-top30"], table).keep)


def one_entry_pool(counts: dict[str, int]) -> list[str]:
    return [f"a photo of a {name}" for name, n in counts.items() for _ in range(n)]


def test_metaclip_caps_every_entry_at_t_and_keeps_all_pairs_of_entries_under_t(tmp_path):
    counts = {"goldfish": 50, "tench": 12, "hammerhead": 10, "tiger shark": 3, "axolotl": 1}
    captions = one_entry_pool(counts) + ["nothing to see here"] * 4
    meta = tmp_path / "meta.txt"
    meta.write_text("\n".join(counts) + "\nunused entry\n")
    recipe = tmp_path / "mine.yaml"
    recipe.write_text("steps:\n  - {rule: metaclip, metadata: meta.txt, t: 10}\n")
    table = pool_of([{"caption": c} for c in captions])
    cur = run(str(recipe), table)
    kept = [c for c, k in zip(captions, cur.keep) if k]
    for name, n in counts.items():
        assert kept.count(f"a photo of a {name}") == min(n, 10), name
    assert [cur.removed[i][0] for i in range(len(captions) - 4, len(captions))] == ["select/metaclip_unmatched"] * 4
    assert {why for why, _ in cur.removed.values()} == {"select/metaclip_balance", "select/metaclip_unmatched"}
    assert cur.steps[0]["entries_over_t"] == 2 and cur.steps[0]["entries_matched"] == 5
    # The draw follows the pairs, not their order: the same pairs are kept from a shuffled pool.
    order = np.random.default_rng(1).permutation(table.num_rows)
    again = run(str(recipe), table.take(pa.array(order)))
    assert set(np.array(table["uid"].to_pylist())[cur.keep]) == set(np.array(again_uids := table.take(
        pa.array(order))["uid"].to_pylist())[again.keep])
    assert len(again_uids) == table.num_rows


def test_metaclip_balancing_keeps_a_multi_entry_pair_with_the_published_probability():
    # 4,000 pairs match entry A (count 4,000) and B (count 4,000 + 4,000 alone); t = 1,000.
    n_both, n_b_only, t = 4000, 4000, 1000
    pair_ids = np.concatenate([np.repeat(np.arange(n_both), 2), np.arange(n_both, n_both + n_b_only)])
    entry_ids = np.concatenate([np.tile([0, 1], n_both), np.ones(n_b_only, np.int64)])
    keys = uid_keys([uid(i) for i in range(n_both + n_b_only)])
    b = balance(n_both + n_b_only, keys, pair_ids, entry_ids, 2, t, seed=3)
    assert b.counts.tolist() == [4000, 8000] and b.picked.tolist() == [1000, 1000]
    p = keep_probability([4000, 8000], t)  # 1 - (1 - 1/4)(1 - 1/8)
    rate = b.keep[:n_both].mean()
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n_both)
    # Each entry drew exactly t pairs; a pair is kept iff one of its entries drew it.
    assert b.keep[n_both:].sum() <= t


def test_metaclip_matching_is_metaclips_substring_rule():
    m = Matcher(["dog", "hot dog", "new york", "c++"])
    assert m.match("A hot dog, in New York.") == [0, 1, 2]
    assert m.match("dogs and hotdogs") == []
    assert m.match("I like c++!") == [3]
    pairs, entries = match_all(m, ["dog", "none", "new york dog"])
    assert pairs.tolist() == [0, 2, 2] and entries.tolist() == [0, 0, 2]


def near_duplicate_groups(n_groups: int, dim: int = 32, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n_groups, dim))
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    sizes = rng.integers(1, 6, n_groups)
    group = np.repeat(np.arange(n_groups), sizes)
    emb = base[group] + rng.normal(scale=0.02, size=(len(group), dim))
    score = rng.random(len(group))
    return emb.astype(np.float32), group, score


def test_a_second_semdedup_pass_finds_the_copies_a_cluster_boundary_hid():
    emb, group, score = near_duplicate_groups(150)
    one = semdedup(emb, 0.05, priority=-score, cluster_size=40)
    two = semdedup(emb, 0.05, priority=-score, cluster_size=40, passes=2)
    assert one.keep.sum() > 150  # some groups were split by the first clustering
    assert np.all(two.keep <= one.keep) and two.keep.sum() < one.keep.sum()
    assert sorted(group[two.keep].tolist()) == sorted(set(group[two.keep].tolist()))  # and rejoined here


@pytest.mark.parametrize("cluster_size", [10_000, 40])
def test_semdedup_keeps_one_of_each_group_and_no_close_pair_in_a_cluster(cluster_size):
    emb, group, score = near_duplicate_groups(150)
    eps = 0.05
    x = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    # The groups are what the rule should find: members close, groups far apart.
    same = group[:, None] == group[None, :]
    sims = x @ x.T
    assert sims[same].min() > 1 - eps and sims[~same].max() < 1 - eps
    res = semdedup(emb, eps, priority=-score, cluster_size=cluster_size)
    assert cluster_size > len(emb) or res.n_clusters > 1
    kept = np.flatnonzero(res.keep)
    for c in range(res.n_clusters):  # no two kept items of a cluster are closer than 1 - eps
        mine = kept[res.cluster[kept] == c]
        assert (sims[np.ix_(mine, mine)] - np.eye(len(mine)) * 2).max(initial=-1) <= 1 - eps
    # Every group keeps one member in each cluster it fell into: exactly one when k-means kept it
    # together (always, with one cluster). A group split across clusters keeps one per part, as
    # SemDeDup does: no pass compares items of different clusters.
    for g in range(150):
        assert np.sum(res.keep[group == g]) == len(set(res.cluster[group == g]))
    split = sum(len(set(res.cluster[group == g])) > 1 for g in range(150))
    assert split == 0 if cluster_size > len(emb) else split < 15
    for g in range(150):  # the best-scoring member
        members = np.flatnonzero(group == g)
        assert res.keep[members[np.argmax(score[members])]]
    dropped = np.flatnonzero(~res.keep)
    assert np.all(group[res.duplicate_of[dropped]] == group[dropped])


def test_the_semdedup_recipe_records_each_drop_and_the_pictures_without_embeddings():
    emb, group, score = near_duplicate_groups(30, seed=2)
    table = pool_of([{"score": float(s)} for s in score] + [{"score": 0.9}])

    def embeddings(idx):
        have = idx < len(emb)
        return have, emb[idx[have]].astype(np.float16)

    cur = run("semdedup", table, embeddings)
    assert cur.keep.sum() == 30 and not cur.keep[-1]
    assert cur.removed[len(emb)][0] == "select/no_embedding"
    assert sum(1 for why, _ in cur.removed.values() if why == "select/semdedup") == len(emb) - 30


def test_a_bad_recipe_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps:\n  - {rule: min_side, at_most: 3}\n")
    with pytest.raises(ConfigError, match="at_least"):
        load(str(bad))
    with pytest.raises(ConfigError, match="unknown recipe"):
        load("no-such-recipe")
    missing = tmp_path / "missing.yaml"
    missing.write_text("steps:\n  - {rule: metaclip, metadata: nowhere.txt}\n")
    with pytest.raises(ConfigError, match="nowhere.txt not found"):
        [step.content() for step in load(str(missing))]
    loop = tmp_path / "loop.yaml"
    loop.write_text("steps:\n  - {recipe: loop.yaml}\n")
    with pytest.raises(ConfigError, match="includes itself"):
        load(str(loop))


# -- through `lait select` -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    from kit import build_data as data

    return data.make_built_work(tmp_path_factory.mktemp("work"))


def test_lait_select_with_recipes_records_every_removal_with_its_reason(work, tmp_path):
    from lait.app.cli import build_parser
    from lait.workdir import WorkDir

    # A user's copy of a shipped recipe, changed: DataComp's basic filter with more words asked
    # for, and a SemDeDup coarse enough to find neighbours among the fixture's random embeddings.
    mine = tmp_path / "mine.yaml"
    mine.write_text("steps:\n  - {recipe: datacomp-basic}\n  - {rule: caption_words, more_than: 3}\n")
    coarse = tmp_path / "coarse.yaml"
    coarse.write_text("steps:\n  - {rule: semdedup, eps: 0.8, cluster_size: 1000, seed: 0}\n")
    out = tmp_path / "sel"
    args = build_parser().parse_args(["select", str(work), "--out", str(out), "--recipe", str(mine),
                                      "--recipe", str(coarse), "--workers", "1", "--samples-per-shard", "16",
                                      "--no-progress"])
    assert args.func(args) == 0
    stats = json.loads((out / "stats.json").read_text())
    steps = stats["recipe"]["steps"]
    assert [(s["recipe"], s["rule"]) for s in steps] == [
        ("datacomp-basic", r) for r in ("language", "caption_words", "caption_chars", "min_side", "aspect")
    ] + [("mine", "caption_words"), ("coarse", "semdedup")]
    assert steps[5]["removed"] == 3  # "a broken grid", "a lossless grid", "an unrelated sentence"
    assert steps[6]["removed"] > 0
    rejected = WorkDir(out / "_select", n_partitions=1).read("rejected")
    reasons = [r for r in rejected["reason"].to_pylist() if r.startswith("select/")]
    assert len(reasons) == stats["recipe"]["removed"] == sum(s["removed"] for s in steps)
    assert stats["selected"] == stats["pool"] - len(reasons) == stats["samples"]
    for s in steps:
        assert sum(s["reasons"].values()) == s["removed"]
        for reason, n in s["reasons"].items():
            assert reasons.count(reason) == n
    details = rejected.filter(pa.compute.equal(rejected["reason"], "select/semdedup"))["detail"].to_pylist()
    assert all(d.startswith("cosine ") for d in details)


def test_a_recipe_and_exclude_eval_together_drop_the_eval_copy_then_apply_the_recipe(work, tmp_path):
    from kit import build_data as data
    from lait.build.config import SelectConfig
    from lait.build.select import select

    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "copy.jpg").write_bytes(data.photo(7))  # a pool picture, in the evaluation set
    cfg = SelectConfig(work=str(work), out=str(tmp_path / "out"), workers=1, progress=False, samples_per_shard=16,
                       recipe=["clip-top30"], exclude_eval=str(tmp_path / "eval"))
    cfg.validate()
    res = select(cfg)  # both read the pool's page_url: once
    assert res.ok, res.summary()
    assert res.stats["eval_overlap"] == 1
    assert res.stats["selected"] == math.ceil(0.3 * (res.stats["pool"] - 1))


def test_a_changed_recipe_file_is_another_selection(work, tmp_path):
    from lait.build.config import SelectConfig
    from lait.build.select import select

    meta = tmp_path / "meta.txt"
    meta.write_text("grid\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - {rule: metaclip, metadata: meta.txt, t: 5}\n")

    def cfg(**kw):
        c = SelectConfig(work=str(work), out=str(tmp_path / "out"), workers=1, progress=False, samples_per_shard=16,
                         recipe=[str(recipe)], **kw)
        c.validate()
        return c

    first = select(cfg())
    assert first.ok and first.stats["selected"] == 5  # every caption names "grid": t of them drawn
    meta.write_text("grid\nphoto\n")  # the metadata changed, the recipe's text did not
    with pytest.raises(ConfigError, match="another selection"):
        select(cfg())
    again = select(cfg(overwrite=True))
    assert again.ok and again.stats["recipe"]["steps"][0]["entries_matched"] == 2


def test_the_row_by_row_pass_of_a_huge_cluster_equals_the_matrix_pass(monkeypatch):
    import lait.build.semdedup as sd

    emb, _, _ = near_duplicate_groups(40, seed=5)
    x = sd.normalise(emb)
    by_matrix = sd.dedup_cluster(x, 0.95)
    monkeypatch.setattr(sd, "MATRIX_MAX", 10)
    by_rows = sd.dedup_cluster(x, 0.95)
    assert np.array_equal(by_matrix[0], by_rows[0]) and np.array_equal(by_matrix[1], by_rows[1])
    assert 40 == by_rows[0].sum() < len(x)


def test_datacomp_image_keeps_the_clusters_nearest_to_the_target_images(tmp_path):
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(6, 16))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    which = np.repeat(np.arange(6), 20)
    emb = (centres[which] + rng.normal(scale=0.05, size=(120, 16))).astype(np.float32)
    targets = centres[[1, 4]] + rng.normal(scale=0.05, size=(2, 16))
    np.save(tmp_path / "imagenet.npy", targets)
    recipe = tmp_path / "image.yaml"
    with pytest.raises(ConfigError, match="targets"):  # the shipped recipe says what it lacks
        run("datacomp-image", pool_of([{}]), lambda idx: (np.ones(len(idx), bool), emb[idx]))
    recipe.write_text("steps:\n  - {rule: image_clusters, targets: imagenet.npy, clusters: 6}\n")
    cur = run(str(recipe), pool_of([{} for _ in range(120)]), lambda idx: (np.ones(len(idx), bool), emb[idx]))
    assert np.array_equal(cur.keep, np.isin(which, [1, 4]))
    assert {why for why, _ in cur.removed.values()} == {"select/image_cluster"}
    assert cur.steps[0]["target_clusters"] == 2


def test_cluster_sums_in_blocks_equal_a_plain_sum():
    import lait.build.semdedup as sd

    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8)).astype(np.float32)
    assign = rng.integers(0, 100, 500)
    assign[assign == 3] = 4  # an empty cluster
    sums, filled = sd.cluster_sums(x, assign, 100, cells=300)  # blocks of 3 rows
    expected = np.zeros((100, 8), np.float32)
    np.add.at(expected, assign, x)
    assert np.allclose(sums, expected, atol=1e-4) and not filled[3] and filled.sum() == len(set(assign.tolist()))
    centroids = sd.normalise(rng.normal(size=(7, 8)))
    assert np.array_equal(sd.nearest(x, centroids, cells=20), np.argmax(x @ centroids.T, axis=1))
