"""`bench/gpu/run.sh --smoke`: the GPU node's script, run on the CPU at tiny sizes, as a GPU image
without the crawler's packages would run it (Scrapy, Twisted, trafilatura and faiss blocked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

BLOCKER = '''
import importlib.abc, sys
BLOCKED = {"scrapy", "twisted", "trafilatura", "faiss", "scrapy_redis", "fastwarc", "warcio", "ray", "w3lib"}
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: a GPU image lacks it)", name=name)
sys.meta_path.insert(0, _Block())
'''


@pytest.mark.slow
def test_the_gpu_script_runs_every_section_without_the_crawler(tmp_path, repo_root, shared_data):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": f"{site}{os.pathsep}{repo_root}",
           "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(repo_root / "bench" / "gpu" / "run.sh"), "--smoke", "--out", str(out),
                           "--photos", str(shared_data / "photos" / "coco_train"), "--tmp", str(tmp_path)],
                          cwd=repo_root, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert not [r for r in rows if r["what"] in ("section failed", "skipped") or r["value"] == "failed"], rows
    by = {(r["section"], r["what"].split(",")[0]): r for r in rows}
    # The crawler really was missing for the run, and every section still gave its figures.
    assert by[("env", "scrapy")]["value"] == "absent" and by[("env", "twisted")]["value"] == "absent"
    cpu = by[("decode", "CPU decode + resize to 224")]
    assert cpu["value"] > 0 and cpu["vs_value"] > 0
    assert "nvJPEG decode + resize on cpu" in {r["what"].split(",")[0] for r in rows}
    cos = by[("decode", "image embedding cosine")]["value"]
    assert float(cos.split(" / ")[0]) > 0.99
    stage = by[("score", "lait score")]
    assert stage["value"] > 0 and stage["vs_value"] > 0 and stage["ratio"] > 0
    assert by[("score", "tiny config: scored pairs")]["value"] == 64 * 3
    trained = [r for r in rows if r["section"] == "train" and r["unit"] == "samples/s"]
    assert len(trained) == 3 and all(r["value"] > 0 for r in trained)
    assert {r["section"] for r in rows} >= {"env", "decode", "score", "train", "gates"}
    table = (out / "results.md").read_text()
    assert table.startswith("# bench/gpu/run.sh on CPU only") and table.count("\n| ") >= len(rows)
