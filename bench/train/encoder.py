"""Our ImageBERT encoder beside ``transformers.BertModel`` of the same size, on the same batch.

    python bench/train/encoder.py [--hidden 384 --layers 6 --heads 12 --batch 32 --seq 64]

Text-only input (so both models see identical work); forward (inference) and forward+backward,
alternating the two models per repeat so machine noise hits both alike. Prints each figure and
ours / transformers (target >= 1.0).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    from transformers import BertConfig, BertModel

    from lait.train.model import ImageBert, ImageBertConfig

    dev = torch.device(args.device)
    inter = 4 * args.hidden
    ours = ImageBert(ImageBertConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                                     intermediate_size=inter, dropout=0.0, attention_dropout=0.0)).to(dev)
    hf = BertModel(BertConfig(hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.heads,
                              intermediate_size=inter, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                              attn_implementation="sdpa"), add_pooling_layer=False).to(dev)
    ids = torch.randint(1000, 30000, (args.batch, args.seq), device=dev)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[: args.batch // 2, args.seq * 3 // 4 :] = False  # some padding, as real batches have
    ids = ids.masked_fill(~mask, 0)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def run(model_fn, backward: bool):
        def go():
            with autocast:
                out = model_fn()
            if backward:
                out.float().mean().backward()
            sync()
        return go

    ours_fn = lambda: ours(ids, mask, None, None, None)  # noqa: E731
    hf_fn = lambda: hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # noqa: E731
    print(f"device={dev} hidden={args.hidden} layers={args.layers} heads={args.heads} batch={args.batch} seq={args.seq}")
    for name, backward in (("forward", False), ("forward+backward", True)):
        ctx = torch.enable_grad() if backward else torch.no_grad()
        with ctx:
            for m in (ours, hf):
                m.train(backward)
            run(ours_fn, backward)(), run(hf_fn, backward)()  # warm-up
            t_ours, t_hf = [], []
            for _ in range(args.repeats):
                t_ours += timed(run(ours_fn, backward), 1)
                t_hf += timed(run(hf_fn, backward), 1)
        a, b = statistics.median(t_ours), statistics.median(t_hf)
        print(f"{name:17s} ours {args.batch / a:8.1f} seq/s  transformers.BertModel {args.batch / b:8.1f} seq/s  "
              f"ratio ours/transformers {b / a:.2f} (target >= 1.0)")


if __name__ == "__main__":
    main()
