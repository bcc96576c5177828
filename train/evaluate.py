"""``lait train eval``: image-text retrieval recall (R@1/5/10 both directions, and their sum).

``full`` scores every (image, text) pair with the ITM cross-encoder, in batches. ``shortlist``
takes the top-k candidates by embedding similarity (faiss, inner product) and re-ranks only those
with ITM; candidates outside the shortlist rank below every shortlisted one. ``embedding`` ranks
by the embeddings' cosine alone: the unimodal passes and the embedding head, no cross-encoder.
Results say which mode produced them, since shortlist recall is bounded by the shortlist's own
recall.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lait.log import progress
from lait.train.batch import Example, collate, round_up
from lait.train.config import EvalConfig

log = logging.getLogger(__name__)
KS = (1, 5, 10)


def recall_at_k(i2t_scores: np.ndarray, t2i_scores: np.ndarray, text_to_image: np.ndarray, ks=KS) -> dict[str, float]:
    """Recall@K from [images, texts] score matrices (one per direction; the same one for full).

    Image->text: an image is a hit at K when any of its texts ranks in its top K. Text->image: a
    text is a hit when its image ranks in its top K. A rank counts the strictly better candidates.
    """
    n_img, n_txt = i2t_scores.shape
    text_to_image = np.asarray(text_to_image)
    # i2t: for each image, the best score among its ground-truth texts -> count texts above it.
    gt = np.full((n_img, n_txt), False)
    gt[text_to_image, np.arange(n_txt)] = True
    best_gt = np.where(gt, i2t_scores, -np.inf).max(1)
    i2t_rank = (np.where(gt, -np.inf, i2t_scores) > best_gt[:, None]).sum(1)
    t2i_gt = t2i_scores[text_to_image, np.arange(n_txt)]
    t2i_rank = (t2i_scores > t2i_gt[None, :]).sum(0)
    out = {}
    for k in ks:
        out[f"i2t_r{k}"] = float((i2t_rank < k).mean())
    for k in ks:
        out[f"t2i_r{k}"] = float((t2i_rank < k).mean())
    out["rsum"] = sum(out[f"i2t_r{k}"] + out[f"t2i_r{k}"] for k in ks)
    return out


@dataclass
class RetrievalSet:
    """Images (as encoded regions) and texts (as token ids), with each text's image index."""

    images: list[Example]
    texts: list[list[int]]
    text_to_image: np.ndarray


def load_shard_set(urls: list[str], decoder, limit: int | None) -> RetrievalSet:
    """One image and its caption per shard sample, in shard order."""
    from lait.train.data import ShardStream

    images, texts = [], []
    raw = ShardStream(urls, decoder, 1, 0, {}, loop=False)._raw_samples(0, 1)
    for s in raw:
        ex = decoder(s)
        images.append(ex)
        texts.append(ex.token_ids)
        if limit and len(images) >= limit:
            break
    return RetrievalSet(images, texts, np.arange(len(images)))


def load_karpathy_set(path: str, image_root: str, split: str, decoder, limit: int | None) -> RetrievalSet:
    """A Karpathy-style JSON (``images: [{filename, filepath?, split, sentences: [{raw}]}]``)."""
    data = json.loads(Path(path).read_text())
    images, texts, owner = [], [], []
    for item in data["images"]:
        if split and item.get("split", split) != split:
            continue
        rel = Path(item.get("filepath", "")) / item["filename"]
        raw = (Path(image_root) / rel).read_bytes()
        ex = decoder({"__key__": str(rel), "txt": item["sentences"][0]["raw"], "jpg": raw})
        for sent in item["sentences"]:
            texts.append(decoder.tokenizer.encode(sent["raw"]))
            owner.append(len(images))
        images.append(ex)
        if limit and len(images) >= limit:
            break
    return RetrievalSet(images, texts, np.asarray(owner))


class RetrievalScorer:
    """Encodes a retrieval set once, then scores pairs with ITM or embeddings."""

    def __init__(self, model, data: RetrievalSet, special, max_text_len: int, max_regions: int, online, device, autocast, batch_size: int,
                 show_progress: bool = True, tags=None):
        self.model, self.device, self.autocast, self.bs = model.eval().to(device), device, autocast, batch_size
        self.show_progress = show_progress
        g = torch.Generator().manual_seed(0)
        # Regions for all images (collate pads them; the online model fills them on the device).
        from lait.train.regions import add_tags, fill_regions

        feats, locs, valid, tag_ids = [], [], [], []
        for i in range(0, len(data.images), batch_size):
            chunk = data.images[i : i + batch_size]
            b = collate(chunk, special, max_text_len, max_regions, g, mask_prob=0.0, region_mask_prob=0.0).to(device)
            if online is not None:
                b = fill_regions(b, online, 0.0)
            b = add_tags(b, tags)
            feats.append(b.region_features)
            locs.append(b.region_locations)
            valid.append(b.region_valid)
            tag_ids.append(b.tag_ids)
        r = max(f.shape[1] for f in feats)
        pad = lambda x, v=0: torch.nn.functional.pad(x, (0, 0, 0, r - x.shape[1]), value=v) if x.dim() == 3 else torch.nn.functional.pad(x, (0, r - x.shape[1]), value=v)  # noqa: E731
        self.feats = torch.cat([pad(f) for f in feats])
        self.locs = torch.cat([pad(x) for x in locs])
        self.valid = torch.cat([pad(v, False) for v in valid])
        self.tag_ids = self.tag_mask = None
        if tags is not None:
            k = max(x.shape[1] for x in tag_ids)
            self.tag_ids = torch.cat([torch.nn.functional.pad(x, (0, k - x.shape[1]), value=special.pad) for x in tag_ids])
            self.tag_mask = self.tag_ids != special.pad
        t = round_up(max(len(x) for x in data.texts[:]) + 2 if data.texts else 8)
        t = min(t, round_up(max_text_len))
        ids = torch.full((len(data.texts), t), special.pad, dtype=torch.long)
        for row, toks in enumerate(data.texts):
            toks = toks[: t - 2]
            ids[row, : len(toks) + 2] = torch.tensor([special.cls, *toks, special.sep])
        self.ids = ids.to(device)
        self.text_mask = self.ids != special.pad

    def _tags(self, rows) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The object tags of some images (indices or a slice), or (None, None) without tags."""
        if self.tag_ids is None:
            return None, None
        return self.tag_ids[rows], self.tag_mask[rows]

    @torch.no_grad()
    def itm(self, text_idx: torch.Tensor, image_idx: torch.Tensor) -> torch.Tensor:
        out = []
        for i in range(0, len(text_idx), self.bs):
            ti, ii = text_idx[i : i + self.bs].to(self.device), image_idx[i : i + self.bs].to(self.device)
            # Texts are padded to the longest of the set; a batch needs only its own longest.
            mask = self.text_mask[ti]
            n = round_up(int(mask.sum(1).max()))
            with self.autocast():
                h = self.model(self.ids[ti][:, :n], mask[:, :n], self.feats[ii], self.locs[ii], self.valid[ii], *self._tags(ii))
                out.append(self.model.itm_score(h[:, 0]).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)

    @torch.no_grad()
    def embeddings(self) -> tuple[np.ndarray, np.ndarray]:
        ims, txs = [], []
        for i in range(0, len(self.feats), self.bs):
            rows = slice(i, i + self.bs)
            tags, tag_mask = self._tags(rows)
            with self.autocast():
                h = self.model(None, None, self.feats[rows], self.locs[rows], self.valid[rows], tags, tag_mask)
                ims.append(self.model.embed(h, self.model.image_mask(tag_mask, self.valid[rows])).float().cpu())
        for i in range(0, len(self.ids), self.bs):
            with self.autocast():
                h = self.model(self.ids[i : i + self.bs], self.text_mask[i : i + self.bs], None, None, None)
                txs.append(self.model.embed(h, self.text_mask[i : i + self.bs]).float().cpu())
        return torch.cat(ims).numpy(), torch.cat(txs).numpy()

    def itm_accuracy(self, text_to_image: np.ndarray, seed: int = 0) -> dict:
        """The ITM head as a classifier on held-out pairs: every image with its first caption
        (a match) and with the first caption of another image drawn at random (no match). A pair
        counts as right when its score (the match logit's margin) has the right sign."""
        n_img = len(self.feats)
        owner = torch.from_numpy(np.asarray(text_to_image))
        first = torch.full((n_img,), -1, dtype=torch.long)
        for t in range(len(owner) - 1, -1, -1):
            first[owner[t]] = t
        if n_img < 2 or bool((first < 0).any()):
            raise ValueError("itm mode needs at least two images, each with a caption")
        g = torch.Generator().manual_seed(seed)
        other = (torch.arange(n_img) + torch.randint(1, n_img, (n_img,), generator=g)) % n_img  # never itself
        images = torch.arange(n_img)
        pos = self.itm(first, images)
        neg = self.itm(first[other], images)
        pos_acc, neg_acc = float((pos > 0).float().mean()), float((neg <= 0).float().mean())
        return {"itm_acc": (pos_acc + neg_acc) / 2, "itm_pos_acc": pos_acc, "itm_neg_acc": neg_acc,
                "itm_auc": float((pos[:, None] > neg[None, :]).float().mean())}

    def full(self) -> np.ndarray:
        """ITM score of every pair: [images, texts]."""
        n_img, n_txt = len(self.feats), len(self.ids)
        scores = np.zeros((n_img, n_txt), dtype=np.float32)
        txt = torch.arange(n_txt)
        for i in progress(range(n_img), desc="eval/full", unit="image", leave=False, disable=not self.show_progress):
            scores[i] = self.itm(txt, torch.full((n_txt,), i)).numpy()
        return scores

    def shortlist(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-direction score matrices (ITM on the embedding top-k, -inf elsewhere) and the
        embeddings' cosine of every pair."""
        import faiss

        img_emb, txt_emb = self.embeddings()
        n_img, n_txt = len(img_emb), len(txt_emb)
        i2t = np.full((n_img, n_txt), -np.inf, dtype=np.float32)
        t2i = np.full((n_img, n_txt), -np.inf, dtype=np.float32)
        # Embedding similarity breaks ties between -inf entries, so ranks stay well defined.
        t_index = faiss.IndexFlatIP(txt_emb.shape[1])
        t_index.add(np.ascontiguousarray(txt_emb))
        _, top_t = t_index.search(np.ascontiguousarray(img_emb), min(k, n_txt))  # texts per image
        i_index = faiss.IndexFlatIP(img_emb.shape[1])
        i_index.add(np.ascontiguousarray(img_emb))
        _, top_i = i_index.search(np.ascontiguousarray(txt_emb), min(k, n_img))  # images per text
        img_idx = torch.arange(n_img).repeat_interleave(top_t.shape[1])
        i2t[img_idx.numpy(), top_t.reshape(-1)] = self.itm(torch.from_numpy(top_t.reshape(-1)).long(), img_idx).numpy()
        txt_idx = torch.arange(n_txt).repeat_interleave(top_i.shape[1])
        t2i[top_i.reshape(-1), txt_idx.numpy()] = self.itm(txt_idx, torch.from_numpy(top_i.reshape(-1)).long()).numpy()
        return i2t, t2i, img_emb @ txt_emb.T


ITM_WEIGHT_SWEEP = (0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


def centre_margins(i2t: np.ndarray, t2i: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The shortlists' ITM margins less the candidate's own mean margin.

    A cross-encoder can score one image above its neighbours whatever the caption (and one
    caption whatever the image). Ranking images for a caption, that bias counts in full; ranking
    captions for an image, the image's bias is the same for every candidate and drops out. So each
    candidate's mean over every pair it was scored in (in both shortlists) is subtracted where it
    is the candidate: the image's in the text-to-image matrix, the text's in the image-to-text one.
    This is query-bank normalisation (Bogolin et al., 2022) with the shortlists as the bank."""
    scored_i2t, scored_t2i = np.isfinite(i2t), np.isfinite(t2i)
    total = np.where(scored_i2t, i2t, 0.0) + np.where(scored_t2i, t2i, 0.0)
    count = scored_i2t.astype(np.int32) + scored_t2i
    image_mean = total.sum(1) / np.maximum(count.sum(1), 1)  # [images]
    text_mean = total.sum(0) / np.maximum(count.sum(0), 1)  # [texts]
    return i2t - text_mean[None, :], t2i - image_mean[:, None]


def save_shortlist(path: str, i2t: np.ndarray, t2i: np.ndarray, cos: np.ndarray, text_to_image: np.ndarray) -> None:
    """The shortlisted pairs of each direction (image index, text index, ITM margin, cosine) as a
    plain .npz (no pickle), for choosing how to rank them without scoring them again."""
    out = {"text_to_image": np.asarray(text_to_image)}
    for name, s in (("i2t", i2t), ("t2i", t2i)):
        img, txt = np.nonzero(np.isfinite(s))
        out.update({f"{name}_image": img, f"{name}_text": txt, f"{name}_itm": s[img, txt], f"{name}_cos": cos[img, txt]})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **out)


def run_eval(cfg: EvalConfig) -> dict:
    """Evaluate a checkpoint; returns (and optionally writes) the metrics with their mode."""
    from lait.train.data import Decoder, default_tokenizer, expand_shards
    from lait.train.finetune import load_trained
    from lait.train.pretrain import check_shard_regions, region_setup, with_tags
    from lait.train.runtime import setup_runtime

    cfg.validate()
    urls = None if cfg.karpathy_json else expand_shards(cfg.shards, "shards")
    rt = setup_runtime(cfg.device, cfg.precision, cfg.cpu_threads)
    model, run_cfg = load_trained(cfg.checkpoint)
    data_cfg = cfg.data_config(run_cfg.get("data"), str(cfg.checkpoint))
    tok = default_tokenizer(data_cfg.tokenizer, run_cfg.get("init_from") if not str(run_cfg.get("init_from", "")).endswith(".pt") else None)
    if urls:
        check_shard_regions(data_cfg.regions, urls)
    regions = with_tags(region_setup(data_cfg.regions, rt.device), data_cfg.regions, tok, rt.device)
    decoder = Decoder(tok, data_cfg.regions.source, data_cfg.regions.image_size, regions.patches)
    if cfg.karpathy_json:
        data = load_karpathy_set(cfg.karpathy_json, cfg.image_root or str(Path(cfg.karpathy_json).parent), cfg.split, decoder, cfg.limit)
    else:
        data = load_shard_set(urls, decoder, cfg.limit)
    t0 = time.perf_counter()
    extra: dict = {}
    scorer = RetrievalScorer(model, data, tok.special, data_cfg.max_text_len, data_cfg.regions.max_regions, regions.online,
                             rt.device, rt.autocast, cfg.batch_size, show_progress=cfg.progress, tags=regions.tags)
    if cfg.mode == "full":
        s = scorer.full()
        metrics = recall_at_k(s, s, data.text_to_image)
        pairs = s.size
    elif cfg.mode == "shortlist":
        i2t, t2i, cos = scorer.shortlist(cfg.shortlist_k)
        itm_only = recall_at_k(i2t, t2i, data.text_to_image)
        # `sum`: the ITM logit margin plus the embeddings' contrastive logit (cosine / the ITC
        # temperature) of the shortlisted pairs, as BLIP ranks its top-k (Li et al., 2022);
        # `itm`: the cross-encoder's score alone. Both are reported; `shortlist_score` says which
        # one the headline figures are.
        from lait.train.model import TEMPERATURE

        itc = cos / TEMPERATURE
        # Outside the shortlist the margins are -inf and stay so, whatever the weight (0 * -inf is
        # nan): the weighted sums are taken over the shortlisted pairs only.
        listed = np.isfinite(i2t), np.isfinite(t2i)
        raw = tuple(np.where(m, s, 0.0) for m, s in zip(listed, (i2t, t2i), strict=True))
        centred = tuple(np.where(m, s, 0.0) for m, s in zip(listed, centre_margins(i2t, t2i), strict=True))

        def summed_at(w: float, centre: bool = False) -> dict[str, float]:
            a, b = (np.where(m, w * s + itc, -np.inf) for m, s in zip(listed, centred if centre else raw, strict=True))
            return recall_at_k(a, b, data.text_to_image)

        w = cfg.shortlist_itm_weight
        summed = summed_at(w)
        metrics = summed if cfg.shortlist_score == "sum" else itm_only
        # The same shortlist under other weights of the margin (0: the embeddings' own order), so
        # that one run on val is enough to choose the weight; and with each candidate's margins
        # centred (`centre_margins`: on Flickr8k val it did not help, docs/learning.md).
        sweep = {f"{v:g}": summed_at(v) for v in ITM_WEIGHT_SWEEP}
        sweep_centred = {f"{v:g}": summed_at(v, True) for v in ITM_WEIGHT_SWEEP}
        extra = {"shortlist_score": cfg.shortlist_score, "itm_weight": w,
                 "itm_only": itm_only, "itm_plus_itc": summed, "itm_weight_sweep": sweep,
                 "itm_weight_sweep_centred": sweep_centred}
        if cfg.scores_output:
            save_shortlist(cfg.scores_output, i2t, t2i, cos, data.text_to_image)
        pairs = int(np.isfinite(i2t).sum() + np.isfinite(t2i).sum())
    elif cfg.mode == "itm":
        metrics = scorer.itm_accuracy(data.text_to_image)
        pairs = 2 * len(data.images)
    elif cfg.mode == "embedding":
        img_emb, txt_emb = scorer.embeddings()
        s = img_emb @ txt_emb.T
        metrics = recall_at_k(s, s, data.text_to_image)
        pairs = 0
    else:
        raise ValueError(f"eval mode must be full, shortlist, embedding or itm, not {cfg.mode!r}")
    result = {"mode": f"shortlist@{cfg.shortlist_k}" if cfg.mode == "shortlist" else cfg.mode, **metrics, **extra,
              "images": len(data.images), "texts": len(data.texts), "itm_pairs_scored": pairs,
              "seconds": time.perf_counter() - t0, "checkpoint": str(cfg.checkpoint)}
    log.info("eval/%s %s", result["mode"], json.dumps({k: round(v, 4) for k, v in metrics.items()}))
    if cfg.output:
        Path(cfg.output).parent.mkdir(parents=True, exist_ok=True)
        Path(cfg.output).write_text(json.dumps(result, indent=2))
    return result


__all__ = ["RetrievalScorer", "load_karpathy_set", "load_shard_set", "recall_at_k", "run_eval"]
