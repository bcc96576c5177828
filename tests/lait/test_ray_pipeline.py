"""Stages 2 to 5 on a local Ray cluster give exactly the local executor's output (issue 8), and
so do the two table passes of `lait documents` (issue 63) and the documents they lead to."""

from __future__ import annotations

import shutil
import tarfile

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed")

from lait.workdir import WorkDir  # noqa: E402

TINY_CLIP = ('{"embed_dim": 32, "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "patch_size": 16,'
             ' "head_width": 32}, "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32,'
             ' "heads": 2, "layers": 2}}')


@pytest.fixture(scope="module")
def crawled(tmp_path_factory):
    """A 30-article local web crawled into a work directory (Scrapy runs in a subprocess)."""
    from lait.crawler.config import CrawlConfig
    from lait.crawler.run import crawl
    from lait.testkit.generator import generate_site
    from lait.testkit.server import SiteServer

    root = tmp_path_factory.mktemp("crawl") / "work"
    with SiteServer(generate_site(30, seed=5)) as srv:
        crawl(CrawlConfig(seeds=[srv.url + "/"], out=str(root), allow_loopback=True, autothrottle=False,
                          n_partitions=4, log_level="WARNING"), quiet=True)
    assert WorkDir(root).count("pages") > 30
    return root


def tables(root) -> dict[str, list[dict]]:
    work = WorkDir(root)
    out = {}
    for t in ("images_ok", "candidates", "scored", "rejected", "image_embs", "near_dups", "doc_pages", "doc_sims"):
        rows = work.read(t).to_pylist()
        out[t] = sorted(rows, key=repr)
    return out


def shard_members(root) -> dict[str, bytes]:
    out = {}
    for tar in sorted((root / "shards").glob("*.tar")):
        with tarfile.open(tar) as tf:
            for m in tf.getmembers():
                out[f"{tar.name}/{m.name}"] = tf.extractfile(m).read()
    return out


def test_stages_2_to_5_on_ray_equal_local(crawled, tmp_path, ray_temp_dir):
    from lait.app.run import run_pipeline

    model = tmp_path / "tiny-clip.json"
    model.write_text(TINY_CLIP)
    sections = {"filter": {}, "clean": {"languages": ["en", "de", "fr"]},
                "score": {"model": "tiny-clip", "model_config": str(model), "allow_random_init": True,
                          "batch_size": 16},
                # A random-init model maps every image to nearly one point: no embedding near-dups.
                "build": {"samples_per_shard": 40, "use_embedding_dups": False}}
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    shutil.copytree(crawled, local)
    shutil.copytree(crawled, on_ray)
    assert run_pipeline(str(local), sections, overrides={"workers": 2, "progress": False})
    # A tiny random scorer's cosines say nothing: every picture stays (min_sim -1).
    documents = {"workers": 2, "progress": False, "min_sim": -1.0, "min_words": 20}
    assert _documents(local, documents)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=ray_temp_dir)
    try:
        assert run_pipeline(str(on_ray), sections, overrides={"executor": "ray", "workers": 2, "progress": False})
        assert _documents(on_ray, {**documents, "executor": "ray"})
    finally:
        ray.shutdown()
    a, b = tables(local), tables(on_ray)
    assert all(a[t] for t in ("images_ok", "candidates", "scored", "doc_pages", "doc_sims"))
    for t in a:
        assert a[t] == b[t], t
    members = shard_members(local)
    assert members and members == shard_members(on_ray)
    docs = {p.name: p.read_bytes() for p in sorted((local / "documents").iterdir()) if p.suffix in (".tar", ".parquet")}
    assert any(name.endswith(".tar") for name in docs)
    assert docs == {p.name: p.read_bytes() for p in sorted((on_ray / "documents").iterdir())
                    if p.suffix in (".tar", ".parquet")}


def _documents(root, settings: dict) -> int:
    """`lait documents` on `root` (its three passes, as the command runs them); the number of
    documents written."""
    from lait.app.documents import make_documents
    from lait.build.config import DocumentsConfig

    reports, stats = make_documents(DocumentsConfig.from_dict({"work": str(root), **settings}))
    assert stats is not None and all(r.ok for r in reports), [r.summary() for r in reports]
    return stats["documents"]
