"""`lait compare` end to end on a tiny pool: two recipes selected, trained and evaluated; the table
and its JSON; a rerun that trains nothing; a changed budget that trains again; the wrong-pair
column against a ground truth; and an evaluation set kept out of every selection."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kit import build_data as data
from lait.app.cli import main

pytestmark = pytest.mark.slow  # four tiny trainings and evaluations: about a minute on two cores

# Pictures whose pair the ground truth below calls wrong: their text is not their true caption.
WRONG = [f"{data.SITE}/img/photo{i}.jpg" for i in (10, 30, 31)] + [f"{data.SITE}/img/weak.jpg"]
COPIED = f"{data.SITE}/img/photo7.jpg"  # its picture is also in the evaluation set


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> dict:
    from lait.build.config import BuildConfig
    from lait.build.pipeline import build
    from lait.train.bert_init import bundled_minilm_dir

    try:
        bundled_minilm_dir()  # the budget's tokenizer
    except Exception as exc:
        pytest.skip(f"the offline MiniLM package is not installed: {exc}")
    root = tmp_path_factory.mktemp("compare")
    work, _ = data.make_work(root / "work")
    assert build(BuildConfig(work=str(root / "work"), workers=1, progress=False, samples_per_shard=16)).ok
    # The held-out set: 8 pictures nobody crawled, and one copy of a pool picture (photo 7).
    (root / "eval" / "images").mkdir(parents=True)
    items = []
    for i in [*range(3000, 3008), 7]:
        (root / "eval" / "images" / f"{i}.jpg").write_bytes(data.photo(i))
        items.append({"filepath": "images", "filename": f"{i}.jpg", "split": "test",
                      "sentences": [{"raw": data.caption(i)}]})
    (root / "eval" / "karpathy.json").write_text(json.dumps({"images": items}))
    truth = {"pages": {}, "images": {}}
    for i in range(data.N_PHOTOS):
        url = f"{data.SITE}/img/photo{i}.jpg"
        true = data.BEST_OF_3 if i == 3 else data.caption(i)
        truth["images"][url] = {"true_caption": "a photo of something else" if url in WRONG else true,
                                "keep": True, "reason": None, "duplicate_of": None}
    truth["images"][f"{data.SITE}/img/weak.jpg"] = {"true_caption": "a grid at dusk", "keep": True}
    truth["images"][f"{data.SITE}/img/photo.png"] = {"true_caption": "a lossless grid", "keep": True}
    (root / "ground_truth.json").write_text(json.dumps(truth))
    return {"root": root, "work": root / "work", "eval": root / "eval" / "karpathy.json",
            "truth": root / "ground_truth.json", "out": root / "out"}


def compare(setup: dict, capsys, *extra: str) -> tuple[int, str, str]:
    argv = ["compare", str(setup["work"]), "--recipe", "clip-top30", "--recipe", "all", "--eval", str(setup["eval"]),
            "--seeds", "2", "--out", str(setup["out"]), "--ground-truth", str(setup["truth"]), "--workers", "1",
            "--no-progress", "--cpu-threads", "1", "--budget-set", "stages.0.steps=4", "stages.0.batch_size=8",
            *extra]
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def selected_urls(folder: Path) -> list[str]:
    rows = []
    for side in sorted(folder.glob("*.parquet")):
        rows += [r["url"] for r in pq.read_table(side, columns=["url", "status"]).to_pylist()
                 if r["status"] == "success"]
    return rows


def test_compare_prints_the_table_and_json_resumes_and_counts_the_wrong_pairs(setup, capsys, monkeypatch):
    import lait.train.pretrain as pretrain

    calls = []
    real = pretrain.run_pretrain
    monkeypatch.setattr(pretrain, "run_pretrain", lambda cfg: calls.append(cfg.seed) or real(cfg))

    rc, out, err = compare(setup, capsys, "--json")
    assert rc == 0, err
    assert sorted(calls) == [0, 0, 1, 1]  # two recipes, two seeds each
    result = json.loads(out)
    assert result == json.loads((setup["out"] / "compare.json").read_text())
    assert [r["recipe"] for r in result["recipes"]] == ["clip-top30", "all"]
    for row in result["recipes"]:
        sel = Path(row["selection"])
        urls = selected_urls(sel)
        assert row["samples"] == len(urls) == sum(json.loads((sel / "sizes.json").read_text()).values())
        # The wrong-pair column is the number of the ground truth's wrong pictures selected.
        assert row["wrong_pairs"] == sum(u in WRONG for u in urls)
        # The evaluation set's copy of photo 7 was dropped from every selection.
        assert row["eval_overlap"] == 1 and COPIED not in urls
        assert [c["seed"] for c in row["runs"]] == [0, 1]
        for c in row["runs"]:
            assert c["steps"] == 4 and c["eval_images"] == 9 and c["eval_texts"] == 9
            assert all(0.0 <= c[m] <= 1.0 for m in ("i2t_r1", "i2t_r10", "t2i_r1", "t2i_r10"))
            assert c["i2t_r1"] <= c["i2t_r5"] <= c["i2t_r10"]
        mean = row["metrics"]["t2i_r5"]["mean"]
        assert mean == pytest.approx(sum(c["t2i_r5"] for c in row["runs"]) / 2)
    top, everything = result["recipes"]
    assert top["samples"] < everything["samples"]
    # photo10 and weak.jpg score low, so clip-top30 holds fewer of the wrong pairs than all.
    assert everything["wrong_pairs"] == 4 and top["wrong_pairs"] < everything["wrong_pairs"]
    # The table went to stderr with a row per recipe: samples, wrong pairs, six R@K as mean ± spread.
    header = next(line for line in err.splitlines() if line.startswith("recipe"))
    assert header.split()[:4] == ["recipe", "samples", "wrong", "pairs"] and header.count("R@") == 6
    for row in result["recipes"]:
        line = next(ln for ln in err.splitlines() if ln.startswith(row["recipe"] + " "))
        assert line.split()[1:3] == [str(row["samples"]), str(row["wrong_pairs"])]
        assert line.count("±") == 6

    # A rerun trains nothing and prints the same table on stdout.
    calls.clear()
    rc, out2, err2 = compare(setup, capsys)
    assert rc == 0, err2
    assert calls == [] and err2.count("not trained again") == 4
    again = json.loads((setup["out"] / "compare.json").read_text())
    assert [r["metrics"] for r in again["recipes"]] == [r["metrics"] for r in result["recipes"]]
    assert out2.splitlines()[0].startswith("recipe") and "clip-top30" in out2

    # Another budget is another cell: trained again.
    rc, _, err3 = compare(setup, capsys, "--seeds", "1", "--budget-set", "stages.0.steps=5")
    assert rc == 0, err3
    assert sorted(calls) == [0, 0]


def test_a_recipe_that_selects_nothing_is_reported_and_the_others_are_judged(setup, capsys, tmp_path):
    nothing = tmp_path / "nothing.yaml"
    nothing.write_text("steps:\n  - {rule: min_score, at_least: 2.0}\n")
    argv = ["compare", str(setup["work"]), "--recipe", str(nothing), "--recipe", "clip-top30", "--eval",
            str(setup["eval"]), "--out", str(setup["out"]), "--workers", "1", "--no-progress", "--cpu-threads", "1",
            "--budget-set", "stages.0.steps=4", "stages.0.batch_size=8"]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "not judged: nothing: ValueError: the recipe selected none of the" in out
    result = json.loads((setup["out"] / "compare.json").read_text())
    assert "error" in result["recipes"][0] and "metrics" in result["recipes"][1]


def test_bad_settings_are_one_line_errors(setup, capsys):
    assert main(["compare", str(setup["work"]), "--eval", str(setup["eval"])]) == 2
    assert "--recipe is required" in capsys.readouterr().err
    assert main(["compare", str(setup["work"]), "--recipe", "all", "--eval", str(setup["root"] / "none.json")]) == 2
    assert "not found" in capsys.readouterr().err
    assert main(["compare", str(setup["work"]), "--recipe", "all", "--recipe", "all", "--eval", str(setup["eval"])]) == 2
    assert "given twice" in capsys.readouterr().err
