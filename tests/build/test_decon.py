"""`--exclude-eval` (`lait.build.decon`): the pictures of an evaluation set kept out of the
shards, each as build/eval_overlap, and nothing else."""

from __future__ import annotations

import io
import json
import random
import re
import shutil
from datetime import datetime, timezone

import numpy as np
import pytest
from PIL import Image

from kit import build_data
from lait.build.config import BuildConfig, SelectConfig
from lait.build.decon import HashIndex, eval_files, load_eval_set
from lait.build.pixels import pixel_diff, pixel_diffs
from lait.config import ConfigError
from lait.workdir import WorkDir, partition_of

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SITE = "http://pool.test"


def jpeg(img: Image.Image, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """The evaluation hashes are kept in $LAIT_CACHE: here, in the test's folder."""
    monkeypatch.setenv("LAIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


# -- the parts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n_entries", [50, 6000])
def test_the_hash_index_finds_every_pair_within_the_radius_and_no_other(n_entries):
    rng = np.random.default_rng(n_entries)
    entries = rng.integers(0, 2**63, n_entries, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    queries = rng.integers(0, 2**63, 3000, dtype=np.int64).astype(np.uint64)
    # Plant queries at every distance up to 11 bits from some entries.
    for k in range(300):
        bits = rng.choice(64, size=k % 12, replace=False)
        queries[k] = entries[k % n_entries] ^ np.uint64(sum(1 << int(b) for b in bits))
    for radius in (0, 4, 8, 10):
        index = HashIndex(entries, radius)
        q, e, d = index.search(queries, chunk=1000)
        dist = np.bitwise_count(queries[:, None] ^ entries[None, :])
        want = set(zip(*[a.tolist() for a in np.nonzero(dist <= radius)]))
        assert set(zip(q.tolist(), e.tolist())) == want and len(want) == len(q) >= 25 * (radius + 1)
        assert (d == dist[q, e]).all()


def test_pixel_diffs_of_a_stack_are_pixel_diff_of_each():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (7, 16, 16, 3), dtype=np.uint8)
    b = rng.integers(0, 120, (16, 16, 3), dtype=np.uint8)
    assert np.allclose(pixel_diffs(a, b), [pixel_diff(x, b) for x in a], atol=1e-3)
    assert np.allclose(pixel_diffs(b, a), [pixel_diff(b, x) for x in a], atol=1e-3)


def grid(i: int, size=(300, 240)) -> Image.Image:
    return Image.open(io.BytesIO(build_data.photo(i, size)))


def test_a_folder_is_walked_for_its_images_and_a_karpathy_json_by_split(tmp_path):
    (tmp_path / "set" / "sub").mkdir(parents=True)
    (tmp_path / "set" / "a.jpg").write_bytes(jpeg(grid(1)))
    grid(2).save(tmp_path / "set" / "sub" / "b.PNG")
    grid(3).save(tmp_path / "set" / "sub" / "c.webp")
    (tmp_path / "set" / "notes.txt").write_text("not an image")
    assert [n for n, _ in eval_files(str(tmp_path / "set"))] == ["a.jpg", "sub/b.PNG", "sub/c.webp"]

    js = tmp_path / "set" / "karpathy.json"
    js.write_text(json.dumps({"images": [
        {"filename": "a.jpg", "split": "train", "sentences": []},
        {"filepath": "sub", "filename": "b.PNG", "split": "test", "sentences": []},
        {"filepath": "sub", "filename": "c.webp", "split": "val", "sentences": []}]}))
    assert [n for n, _ in eval_files(str(js))] == ["a.jpg", "sub/b.PNG", "sub/c.webp"]
    assert [n for n, _ in eval_files(str(js), ["test", "val"])] == ["sub/b.PNG", "sub/c.webp"]
    with pytest.raises(ConfigError, match="has the splits test, train, val"):
        eval_files(str(js), ["restval"])
    with pytest.raises(ConfigError, match="are not in"):
        eval_files(str(js), root=str(tmp_path))
    with pytest.raises(ConfigError, match="no such folder or file"):
        eval_files(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no images"):
        eval_files(str(tmp_path / "empty"))
    with pytest.raises(ConfigError, match="applies to a Karpathy JSON"):
        eval_files(str(tmp_path / "set"), ["test"])


def test_a_karpathy_json_finds_its_images_in_the_usual_folders_beside_it(tmp_path, shared_data):
    """Issue 52: the images of a Karpathy JSON are usually in a folder beside it (`images/` of the
    shared Flickr8k, Kaggle's `Images/`, COCO's `train2014/` by `filepath`): found without
    --exclude-eval-root, which still chooses when given."""
    flickr = shared_data / "photos" / "flickr8k"
    found = eval_files(str(flickr / "karpathy.json"), ["test"])
    assert len(found) == 875 and all(f.parent == flickr / "images" and f.is_file() for _, f in found)
    assert found == eval_files(str(flickr / "karpathy.json"), ["test"], root=str(flickr / "images"))

    js = tmp_path / "set" / "dataset.json"
    (tmp_path / "set" / "Images").mkdir(parents=True)
    (tmp_path / "set" / "notes").mkdir()
    for name in ("a.jpg", "b.jpg"):
        Image.new("RGB", (8, 8)).save(tmp_path / "set" / "Images" / name)
    js.write_text(json.dumps({"images": [{"filename": n, "split": "test"} for n in ("a.jpg", "b.jpg")]}))
    assert eval_files(str(js)) == [(n, tmp_path / "set" / "Images" / n) for n in ("a.jpg", "b.jpg")]
    (tmp_path / "set" / "Images" / "b.jpg").unlink()  # a folder with some of them is not the one
    with pytest.raises(ConfigError, match="1 of its 2 images are not beside it or in a folder beside it"):
        eval_files(str(js))


def test_an_unreadable_evaluation_image_is_an_error_that_names_it(tmp_path):
    (tmp_path / "a.jpg").write_bytes(jpeg(grid(1)))
    (tmp_path / "broken.jpg").write_bytes(jpeg(grid(2))[:300])
    with pytest.raises(ConfigError, match="broken.jpg is not a readable image"):
        load_eval_set(str(tmp_path))


def test_the_digest_is_the_content_of_the_set_not_its_names(tmp_path):
    for name, i in (("one/a.jpg", 1), ("one/b.jpg", 2), ("two/x.jpg", 2), ("two/y.jpg", 1), ("three/a.jpg", 1),
                    ("three/b.jpg", 4)):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(jpeg(grid(i)))
    one, two, three = (load_eval_set(str(tmp_path / d)).digest for d in ("one", "two", "three"))
    assert one == two != three


def test_a_set_is_hashed_once_and_again_when_a_file_changes(tmp_path, own_cache, monkeypatch):
    from lait.build import decon

    (tmp_path / "set").mkdir()
    for i in (1, 2):
        (tmp_path / "set" / f"{i}.jpg").write_bytes(jpeg(grid(i)))
    first = load_eval_set(str(tmp_path / "set"))
    assert len(list((own_cache / "eval-hashes").glob("*.npy"))) == 1
    decon._MEMO.clear()  # as a new process: the hashes come from the cache, nothing is decoded

    def no_decoding(data, name):
        raise AssertionError(f"{name} hashed again")

    monkeypatch.setattr(decon, "view_hashes", no_decoding)
    assert (load_eval_set(str(tmp_path / "set")).hashes == first.hashes).all()
    (tmp_path / "set" / "2.jpg").write_bytes(jpeg(grid(3)))
    with pytest.raises(AssertionError, match="hashed again"):
        load_eval_set(str(tmp_path / "set"))


def test_a_damaged_hash_cache_is_hashed_again_not_trusted(tmp_path, own_cache):
    from lait.build import decon

    (tmp_path / "set").mkdir()
    for i in (1, 2):
        (tmp_path / "set" / f"{i}.jpg").write_bytes(jpeg(grid(i)))
    first = load_eval_set(str(tmp_path / "set")).hashes.copy()
    (cached,) = (own_cache / "eval-hashes").glob("*.npy")
    raw = bytearray(cached.read_bytes())
    raw[-3] ^= 0x10  # a flipped bit in the last hash
    cached.write_bytes(bytes(raw))
    decon._MEMO.clear()
    assert (load_eval_set(str(tmp_path / "set")).hashes == first).all()


# -- the build: synthetic pictures, the fingerprint --------------------------------------------
def run_build(work: WorkDir, **settings):
    from lait.build.pipeline import build

    cfg = BuildConfig(work=str(work.root), workers=1, progress=False, samples_per_shard=100, **settings)
    cfg.validate()
    result = build(cfg)
    assert result.ok, result.summary()
    return result


def reasons(work: WorkDir, prefix: str = "build/") -> dict[str, str]:
    return {r["image_url"]: r["reason"] for r in work.iter_rows("rejected")
            if r["image_url"] and r["reason"].startswith(prefix)}


def test_the_build_drops_the_evaluation_pictures_and_a_changed_set_rebuilds(tmp_path):
    from lait.build.pipeline import build_record

    work, expect = build_data.make_work(tmp_path / "work")
    plain = run_build(work)
    shipped = plain.stats["samples"]
    # Without the flag its bounds are no settings of the build: no dataset is rebuilt for them.
    assert "eval_max_phash" not in build_record(work)["config"] and plain.stats["exclude_eval"] is None
    evals = tmp_path / "eval"
    evals.mkdir()
    # photo 5 has a smaller copy in the pool (small5.jpg): both go; photo 20 is on its own.
    for i in (5, 20):
        (evals / f"e{i}.jpg").write_bytes(jpeg(grid(i, (200, 160)), 80))

    result = run_build(work, exclude_eval=str(evals))
    assert "eval_set" in result.reports[0].plan[0] and build_record(work)["config"]["eval_max_phash"] == 8
    dropped = {u for u, r in reasons(work).items() if r == "build/eval_overlap"}
    assert dropped == {f"{build_data.SITE}/img/photo5.jpg", f"{build_data.SITE}/img/small5.jpg",
                       f"{build_data.SITE}/img/photo20.jpg"}
    assert result.stats["samples"] == shipped - 2
    counters = result.stats["counters"]
    assert counters["build/eval_overlap"] == 3 and counters["build/eval_images"] == 2
    assert result.stats["exclude_eval"]["source"] == str(evals) and result.stats["exclude_eval"]["images"] == 2
    assert json.loads((work.root / "shards" / "stats.json").read_text())["exclude_eval"]["images"] == 2
    # The report counts them as every other rule of stage 5: in the funnel and the reasons.
    from lait.app.report import gather, summary_text

    st = gather(work.root)
    shards = [r for r in st.funnel if r.unit == "images" and r.step == "in shards"][0]
    assert shards.dropped["build/eval_overlap"] == 3
    assert re.search(r"build/eval_overlap\s+3\b", summary_text(st))
    # Every other outcome is the plain build's.
    others = {u: r for u, r in reasons(work).items() if u not in dropped}
    assert others == {u: r for u, r in expect.items() if r.startswith("build/") and u not in dropped}

    assert all(not r.done for r in run_build(work, exclude_eval=str(evals)).reports)  # nothing changed
    (evals / "e20.jpg").unlink()
    again = run_build(work, exclude_eval=str(evals))
    assert any("changed eval_set" in line for line in again.reports[0].plan)
    assert {u for u, r in reasons(work).items() if r == "build/eval_overlap"} == dropped - {
        f"{build_data.SITE}/img/photo20.jpg"}


# -- the acceptance case: real photos ----------------------------------------------------------
N_EVAL = 40
OTHER_TRAIN, OTHER_VAL = 150, 50
# A second frame of test photo 3323988406's skatepark scene, taken seconds later: 8 bits and a
# pixel difference of 40 from it, so the check takes it for the same picture (as a reviewer
# would, for leakage); it is no copy, so the pool of "other photos" leaves it out.
SAME_SCENE = "3540241710_a4f49cde52.jpg"


def planted_copies(img: Image.Image, rng: random.Random) -> dict[str, bytes]:
    """The copies of an evaluation photo a crawl may meet: resized to 160 and 400 px (long side),
    re-encoded at another JPEG quality, cropped by 3 % of each side's length at a random offset and
    from one corner."""
    w, h = img.size
    out = {}
    for side in (160, 400):
        f = side / max(w, h)
        out[f"r{side}"] = jpeg(img.resize((round(w * f), round(h * f)), Image.Resampling.LANCZOS), 90)
    out["q55"] = jpeg(img, 55)
    dx, dy = round(w * 0.03), round(h * 0.03)
    x0, y0 = rng.randint(0, dx), rng.randint(0, dy)
    out["crop3"] = jpeg(img.crop((x0, y0, w - (dx - x0), h - (dy - y0))), 85)
    out["crop3-corner"] = jpeg(img.crop((dx, dy, w, h)), 85)  # all of it off the top and the left
    return out


def images_row(url: str, data: bytes) -> dict:
    return {"image_url": url, "page_url": url.rsplit("/", 1)[0] + "/page.html", "bytes": data,
            "mime": "image/jpeg", "status": 200, "fetched_at": T0, "error": None}


def write(work: WorkDir, table: str, rows: list[dict]) -> None:
    by_part: dict[int, list[dict]] = {}
    for r in rows:
        by_part.setdefault(partition_of(r["image_url"], work.n_partitions), []).append(r)
    for p, part in by_part.items():
        w = work.writer(table, p, "test")
        w.write_many(part)
        w.close()


@pytest.fixture(scope="module")
def contaminated_pool(shared_data, tmp_path_factory):
    """A work directory whose images went through stage 2: 40 Flickr8k test photos planted five
    times each (`planted_copies`), 200 other Flickr8k photos (train and val) and the 80 COCO
    photos; one scored text per image. Returns it, the planted URLs and the others'."""
    from lait.executor import LocalExecutor
    from lait.filters.config import FilterConfig
    from lait.filters.image_stage import ImageFilterStage

    flickr = shared_data / "photos" / "flickr8k"
    split = {it["filename"]: it["split"] for it in json.loads((flickr / "karpathy.json").read_text())["images"]}
    by_split: dict[str, list[str]] = {}
    for name in sorted(split):
        by_split.setdefault(split[name], []).append(name)
    rng = random.Random(31)
    rows, planted, others = [], set(), set()
    for name in rng.sample(by_split["test"], N_EVAL):
        img = Image.open(flickr / "images" / name).convert("RGB")
        for kind, data in planted_copies(img, rng).items():
            url = f"{SITE}/copies/{kind}/{name}"
            rows.append(images_row(url, data))
            planted.add(url)
    pool_photos = ([flickr / "images" / n for n in rng.sample([n for n in by_split["train"] if n != SAME_SCENE],
                                                              OTHER_TRAIN)]
                   + [flickr / "images" / n for n in rng.sample(by_split["val"], OTHER_VAL)]
                   + sorted((shared_data / "photos" / "coco_train").glob("*.jpg")))
    for path in pool_photos:
        url = f"{SITE}/photos/{path.name}"
        rows.append(images_row(url, path.read_bytes()))
        others.add(url)

    work = WorkDir(tmp_path_factory.mktemp("decon") / "work", n_partitions=2).init()
    write(work, "images", rows)
    # Decontamination is what is tested: no safety gate (open-nsfw put two of these real photos
    # at 0.81-0.82 with onnxruntime 1.32, over its 0.8 line) and no face detector (slow, beside the point).
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False, min_side=100, unsafe_model="none")
    assert LocalExecutor(workers=1, retries=0, show_progress=False).run(ImageFilterStage(cfg), work).ok
    assert work.count("images_ok") == len(rows)  # stage 2 kept every photo and copy
    write(work, "scored", [{"image_url": r["image_url"], "page_url": r["page_url"], "text": f"photo {k}",
                            "source": "alt", "lang": "en", "score": 0.3, "model": "test", "pretrained": None,
                            "image_emb_ref": None, "text_emb_ref": None} for k, r in enumerate(rows)])
    return work, planted, others, flickr


def shipped_urls(work: WorkDir) -> set[str]:
    return set(work.read("build_plan", columns=["image_url"]).column(0).to_pylist())


def test_copies_of_an_evaluation_set_are_all_dropped_and_no_other_photo(contaminated_pool):
    work, planted, others, flickr = contaminated_pool
    result = run_build(work, exclude_eval=str(flickr / "karpathy.json"), exclude_eval_split=["test"],
                       exclude_eval_root=str(flickr / "images"))
    got = reasons(work)
    assert {u for u, r in got.items() if r == "build/eval_overlap"} == planted
    assert shipped_urls(work) == others
    assert result.stats["counters"]["build/eval_overlap"] == len(planted) == 5 * N_EVAL
    assert result.stats["counters"]["build/eval_images"] == 875  # the whole test split
    details = [r["detail"] for r in work.iter_rows("rejected") if r["reason"] == "build/eval_overlap"]
    assert all("evaluation image" in d for d in details)


def test_a_folder_of_the_evaluation_photos_does_the_same_and_select_excludes_too(contaminated_pool, tmp_path,
                                                                                   monkeypatch):
    from lait.build import decon
    from lait.build.select import select

    # Small blocks of pool images and a small cache of evaluation images: every path of the check.
    monkeypatch.setattr(decon, "POOL_BLOCK", 16)
    monkeypatch.setattr(decon, "EVAL_VIEWS_KEPT", 5)

    work, planted, others, flickr = contaminated_pool
    run_build(work)  # no exclusion: the copies are in the pool, grouped as duplicates of each other
    assert planted & shipped_urls(work)
    evals = tmp_path / "eval"
    for name in {u.rsplit("/", 1)[1] for u in planted}:
        (evals / name[:2]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(flickr / "images" / name, evals / name[:2] / name)

    cfg = SelectConfig(work=str(work.root), out=str(tmp_path / "sel"), workers=1, progress=False,
                       exclude_eval=str(evals))
    cfg.validate()
    result = select(cfg)
    assert result.ok
    state = WorkDir(tmp_path / "sel" / "_select", n_partitions=1)
    dropped = {r["image_url"] for r in state.iter_rows("rejected") if r["reason"] == "build/eval_overlap"}
    # The pool holds one image per picture: each planted photo's kept copy is dropped.
    pool = set(work.read("pool", columns=["image_url"]).column(0).to_pylist())
    assert dropped == pool & planted and len(dropped) >= N_EVAL
    assert set(state.read("build_plan", columns=["image_url"]).column(0).to_pylist()) == others
    assert result.stats["eval_overlap"] == len(dropped) and result.stats["eval_images"] == N_EVAL
    assert result.stats["exclude_eval"]["source"] == str(evals)
    assert f"{len(dropped)} pool samples dropped as copies of the {N_EVAL} evaluation images" in result.summary()


def test_the_flags_from_the_command_line_and_a_pipeline_yaml(tmp_path):
    from lait.app.cli import build_parser

    def cli(argv: list[str]) -> int:
        args = build_parser().parse_args(argv)
        return args.func(args)

    work, _ = build_data.make_work(tmp_path / "w")
    evals = tmp_path / "eval"
    evals.mkdir()
    (evals / "e9.jpg").write_bytes(jpeg(grid(9, (200, 160)), 80))
    with pytest.raises(ConfigError, match="no such folder or file"):
        cli(["build", str(work.root), "--exclude-eval", str(tmp_path / "nowhere")])
    with pytest.raises(ConfigError, match="need --exclude-eval"):
        cli(["build", str(work.root), "--exclude-eval-split", "test"])
    yaml_file = tmp_path / "pipeline.yaml"
    yaml_file.write_text(f"build:\n  exclude_eval: {evals}\n  samples_per_shard: 100\n")
    assert cli(["run", str(work.root), "--config", str(yaml_file), "--from", "build", "--workers", "1",
                "--no-progress"]) == 0
    assert reasons(work)[f"{build_data.SITE}/img/photo9.jpg"] == "build/eval_overlap"
    tar = work.root / "shards" / "00000.tar"
    made = tar.stat().st_mtime_ns
    assert cli(["build", str(work.root), "--exclude-eval", str(evals), "--samples-per-shard", "100",
                "--workers", "1", "--no-progress"]) == 0
    assert tar.stat().st_mtime_ns == made  # the same set and settings as `lait run`'s: nothing redone
    assert "exclude_eval: " in (work.root / "_configs" / "build.yaml").read_text()
