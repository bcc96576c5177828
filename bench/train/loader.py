"""Training throughput with the real shard loader beside the same steps on in-memory batches.

    python bench/train/loader.py [--steps 40 --batch 32 --workers 1 --regions 36 --dim 768]

Writes synthetic shards with precomputed region features (the builder's format), trains a small
ImageBERT through the real ``Trainer`` twice: fed by the WebDataset pipeline (tar reading,
decoding, tokenisation, collation in ``--workers`` worker processes), then by the same batches
held in memory. Prints samples/s for both and loader / in-memory (target >= 0.9).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))  # the test kit, tests/kit/


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--regions", type=int, default=36)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch

    from kit.synthetic_shards import object_samples, write_shards
    from lait.train.bert_init import bundled_minilm_dir
    from lait.train.checkpoint import Position
    from lait.train.config import DataConfig, OptimConfig, RegionConfig, TaskWeights, TrainStageConfig
    from lait.train.data import Decoder, WordPiece
    from lait.train.loop import StagePlan, Trainer
    from lait.train.model import ImageBert, ImageBertConfig
    from lait.train.objectives import PretrainTask
    from lait.train.pretrain import RegionSetup, make_prepare, stream_factory
    from lait.train.runtime import setup_runtime

    rt = setup_runtime(args.device)
    tmp = Path(tempfile.mkdtemp(prefix="lait-bench-loader-"))
    n = args.batch * (args.steps + 8)
    per_shard = -(-n // max(2, 2 * args.workers))
    write_shards(tmp / "shards", object_samples(n, seed=0, feature_dim=args.dim, num_classes=100, max_objects=args.regions), per_shard)
    tok = WordPiece(bundled_minilm_dir())
    data = DataConfig(num_workers=args.workers, shuffle_buffer=256, regions=RegionConfig(source="shard", max_regions=args.regions))
    decoder = Decoder(tok, "shard", 224)
    collate_kwargs = dict(special=tok.special, max_text_len=40, max_regions=args.regions, itm_negative_prob=0.5)
    urls = sorted(str(p) for p in (tmp / "shards").glob("*.tar"))
    real = stream_factory(urls, decoder, args.batch, 0, collate_kwargs, rt, data)
    cached = list(itertools.islice(iter(stream_factory(urls, decoder, args.batch, 0, collate_kwargs, rt,
                                                       DataConfig(num_workers=0, shuffle_buffer=256))(0)), args.steps))
    stage = TrainStageConfig(name="bench", steps=args.steps, batch_size=args.batch, optim=OptimConfig(lr=1e-4), tasks=TaskWeights())
    mcfg = ImageBertConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=max(1, args.hidden // 64),
                           intermediate_size=4 * args.hidden, region_feature_dim=args.dim, num_object_classes=100)
    results = {}
    for name, open_stream in (("in-memory", lambda skip: iter(cached)), ("shard loader", real)) * 2:
        torch.manual_seed(0)
        model = ImageBert(mcfg)
        trainer = Trainer(PretrainTask(model, stage.tasks), model, rt, tmp / name.replace(" ", "-"), {}, log_every=10**9,
                          checkpoint_every=0, tensorboard=False, num_workers=args.workers if name == "shard loader" else 0)
        plan = StagePlan(0, stage, args.steps, open_stream, make_prepare(model, RegionSetup(None, None, args.dim, None), 0.15))
        t = time.perf_counter()
        trainer.run_stage(plan, Position(), None)
        results.setdefault(name, []).append(args.steps * args.batch / (time.perf_counter() - t))
    mem, real_sps = max(results["in-memory"]), max(results["shard loader"])
    print(f"device={rt.device} steps={args.steps} batch={args.batch} workers={args.workers} regions={args.regions}x{args.dim} "
          f"model={args.hidden}x{args.layers}")
    print(f"in-memory batches   {mem:8.1f} samples/s (best of 2)")
    print(f"shard loader        {real_sps:8.1f} samples/s (best of 2, includes worker start-up)")
    print(f"ratio loader / in-memory {real_sps / mem:.2f} (target >= 0.9)")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
