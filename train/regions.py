"""Region feature sources: pixel patches (in the data workers), or a frozen model run on the
training device: an open_clip visual tower, a torchvision detector, or the packaged ImageNet CNN
of `lait.models` (`cnn`: real pretrained features offline). Every source yields features,
normalised x1,y1,x2,y2 boxes and, where it has them, object classes for MOC."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lait.arrays import cell_grid, grid_boxes
from lait.train.batch import Batch, box_locations, round_up, set_regions
from lait.train.config import RegionConfig

log = logging.getLogger(__name__)


@dataclass
class PatchPooling:
    """Regions = grid cells, each average-pooled to ``pixels x pixels`` RGB values (no model).

    Cheap enough for the data workers; the feature is what the pixels of that cell look like.
    """

    rows: int = 6
    cols: int = 6
    pixels: int = 4

    @property
    def feature_dim(self) -> int:
        return 3 * self.pixels * self.pixels

    def __call__(self, image: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        small = F.adaptive_avg_pool2d(image[None], (self.rows * self.pixels, self.cols * self.pixels))[0]
        cells = small.view(3, self.rows, self.pixels, self.cols, self.pixels).permute(1, 3, 0, 2, 4)
        feats = (cells.reshape(self.rows * self.cols, -1) - 0.5) * 4.0  # centred, ~unit scale
        return feats.numpy().astype(np.float16), grid_boxes(self.rows, self.cols)


class ClipRegions(torch.nn.Module):
    """Patch tokens of a frozen open_clip visual tower, one region per patch."""

    def __init__(self, cfg: RegionConfig):
        super().__init__()
        import open_clip

        if cfg.clip_pretrained is None and not cfg.allow_random_weights:
            raise ValueError("regions.clip_pretrained is required (a pretrained tag or checkpoint path)")
        model = open_clip.create_model(cfg.clip_model, pretrained=cfg.clip_pretrained)  # raises if unloadable
        visual = model.visual.eval().requires_grad_(False)
        if not hasattr(visual, "output_tokens"):
            raise ValueError(f"{cfg.clip_model}: only ViT towers expose patch tokens")
        visual.output_tokens = True
        self.visual = visual
        size = visual.image_size if isinstance(visual.image_size, int) else visual.image_size[0]
        self.image_size = size
        grid = visual.grid_size
        self.boxes = torch.from_numpy(grid_boxes(grid[0], grid[1]))
        mean = getattr(visual, "image_mean", None) or open_clip.OPENAI_DATASET_MEAN
        std = getattr(visual, "image_std", None) or open_clip.OPENAI_DATASET_STD
        self.register_buffer("mean", torch.tensor(mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(1, 3, 1, 1), persistent=False)
        self.feature_dim = visual.transformer.width
        self.num_classes = 0

    @torch.no_grad()
    def forward(self, images: torch.Tensor):
        x = F.interpolate(images, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
        _, tokens = self.visual((x - self.mean) / self.std)
        b = tokens.shape[0]
        boxes = self.boxes.to(tokens.device).expand(b, -1, -1)
        valid = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)
        return tokens.float(), boxes, valid, None


class CnnRegions(torch.nn.Module):
    """Cells of a frozen pretrained CNN's last feature map (EfficientNet-Lite0: 7 x 7 x 1280 at
    224 px), average-pooled down to at most ``max_regions`` cells, each with its grid box. The MOC
    class of a cell is the classifier's own ImageNet label of it: its pooled head applied to the
    cell's feature (the head is linear, so a cell is classified as a small image would be)."""

    def __init__(self, cfg: RegionConfig, max_regions: int):
        super().__init__()
        from lait.models import load_image_classifier

        clf = load_image_classifier(cfg.cnn_model, "cpu")  # packaged weights, or ModelUnavailable
        self.net = clf.net  # a submodule, so that .to(device) moves it
        self.classifier = clf
        self.image_size = clf.image_size
        side = clf.image_size // 32
        self.rows, self.cols = cell_grid(side, side, max_regions)
        self.register_buffer("boxes", torch.from_numpy(grid_boxes(self.rows, self.cols)), persistent=False)
        self.feature_dim = clf.feature_dim
        self.num_classes = clf.num_classes

    @torch.no_grad()
    def forward(self, images: torch.Tensor):
        if images.shape[-1] != self.image_size or images.shape[-2] != self.image_size:
            images = F.interpolate(images, size=(self.image_size, self.image_size), mode="bilinear",
                                   align_corners=False)
        fmap = self.classifier.feature_map(self.classifier.normalise(images))
        if fmap.shape[-2:] != (self.rows, self.cols):
            fmap = F.adaptive_avg_pool2d(fmap, (self.rows, self.cols))
        feats = fmap.flatten(2).transpose(1, 2).float()  # (B, cells, D), row-major like the boxes
        labels = self.classifier.classify(feats).argmax(-1)
        b = feats.shape[0]
        valid = torch.ones(feats.shape[:2], dtype=torch.bool, device=feats.device)
        return feats, self.boxes.expand(b, -1, -1), valid, labels


class DetectorRegions(torch.nn.Module):
    """RoI features (the box head's output) and classes of a frozen torchvision Faster R-CNN."""

    def __init__(self, cfg: RegionConfig, max_regions: int):
        super().__init__()
        import torchvision

        weights = cfg.detector_weights
        if weights is None and not cfg.allow_random_weights:
            raise ValueError("regions.detector_weights is required")
        builder = getattr(torchvision.models.detection, cfg.detector)
        if weights and weights.endswith((".pth", ".pt")):
            model = builder(weights=None, weights_backbone=None)
            model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        else:
            model = builder(weights=weights, weights_backbone=None)
        model.roi_heads.score_thresh = cfg.detector_score_threshold
        model.roi_heads.detections_per_img = max_regions
        self.model = model.eval().requires_grad_(False)
        self.max_regions = max_regions
        self.feature_dim = model.roi_heads.box_head(torch.zeros(1, *self._roi_shape())).shape[-1]
        self.num_classes = model.roi_heads.box_predictor.cls_score.out_features

    def _roi_shape(self):
        channels = self.model.backbone.out_channels
        size = self.model.roi_heads.box_roi_pool.output_size
        size = size if isinstance(size, (list, tuple)) else (size, size)
        return (channels, *size)

    @torch.no_grad()
    def forward(self, images: torch.Tensor):
        m = self.model
        image_list, _ = m.transform(list(images))
        features = m.backbone(image_list.tensors)
        proposals, _ = m.rpn(image_list, features)
        dets, _ = m.roi_heads(features, proposals, image_list.image_sizes)
        boxes = [d["boxes"] for d in dets]
        roi = m.roi_heads.box_head(m.roi_heads.box_roi_pool(features, boxes, image_list.image_sizes))
        b, r = len(dets), self.max_regions
        feats = images.new_zeros(b, r, self.feature_dim)
        out_boxes = images.new_zeros(b, r, 4)
        labels = torch.full((b, r), -100, dtype=torch.long, device=images.device)
        valid = torch.zeros(b, r, dtype=torch.bool, device=images.device)
        start = 0
        for i, d in enumerate(dets):
            n = min(r, len(d["boxes"]))
            sh, sw = image_list.image_sizes[i]
            scale = torch.tensor([sw, sh, sw, sh], device=images.device, dtype=images.dtype)
            feats[i, :n] = roi[start : start + n]
            out_boxes[i, :n] = d["boxes"][:n] / scale
            labels[i, :n] = d["labels"][:n]
            valid[i, :n] = True
            start += len(d["boxes"])
        return feats, out_boxes, valid, labels


class ObjectTags(torch.nn.Module):
    """Object tags as in Oscar (Li et al., 2020): the words of what is in the picture, fed to the
    transformer beside its regions so that text and image meet on words the text encoder already
    knows. Here the tags are the packaged CNN's top ``count`` ImageNet classes of the whole image:
    its linear head applied to the mean of the region cells (the pooled feature it was trained
    on), each class name as WordPieces, joined by commas and closed by [SEP]. They are computed
    from the regions themselves, so they follow an image wherever a batch pairs it."""

    def __init__(self, cfg: RegionConfig, tokenizer, device: torch.device | str = "cpu"):
        super().__init__()
        from lait.models import imagenet_classes, load_image_classifier

        fc = load_image_classifier(cfg.cnn_model, "cpu").net._fc  # packaged weights, or ModelUnavailable
        self.head = torch.nn.Linear(fc.in_features, fc.out_features).requires_grad_(False)
        self.head.load_state_dict(fc.state_dict())
        self.count = cfg.tags
        self.feature_dim = fc.in_features
        special = tokenizer.special
        comma = tokenizer.encode(",")
        words = [tokenizer.encode(name) + comma for name in imagenet_classes()]
        width = max(len(w) for w in words)
        table = torch.full((len(words), width), special.pad, dtype=torch.long)
        for i, w in enumerate(words):
            table[i, : len(w)] = torch.tensor(w)
        self.register_buffer("words", table, persistent=False)  # [classes, width], comma-ended
        self.register_buffer("lengths", torch.tensor([len(w) for w in words]), persistent=False)
        self.pad, self.sep = special.pad, special.sep
        self.to(device)

    @torch.no_grad()
    def forward(self, features: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[B,R,D] region features, [B,R] valid -> ([B,K] tag ids, [B,K] mask)."""
        if features.shape[-1] != self.feature_dim:
            raise ValueError(f"regions.tags reads the CNN's {self.feature_dim}-d cells, but the regions are "
                             f"{features.shape[-1]}-d (use regions.source cnn, or shards written by it)")
        m = valid.to(self.head.weight.dtype)[..., None]
        pooled = (features.to(self.head.weight.dtype) * m).sum(1) / m.sum(1).clamp_min(1.0)
        top = self.head(pooled).topk(self.count, dim=-1).indices  # [B,count], most likely first
        words, lengths = self.words[top], self.lengths[top]  # [B,count,W], [B,count]
        keep = torch.arange(words.shape[-1], device=words.device) < lengths[..., None]
        b = top.shape[0]
        n = lengths.sum(1)  # the last comma becomes [SEP]
        k = round_up(int(n.max()))
        ids = torch.full((b, k), self.pad, dtype=torch.long, device=words.device)
        flat = words[keep]  # row-major: each image's words in order
        cols = torch.cat([torch.arange(int(x), device=words.device) for x in n.tolist()])
        rows = torch.arange(b, device=words.device).repeat_interleave(n)
        ids[rows, cols] = flat
        ids[torch.arange(b, device=words.device), n - 1] = self.sep
        return ids, ids != self.pad


def add_tags(batch: Batch, tagger: ObjectTags | None) -> Batch:
    """Set a batch's object tags from its (unmasked) region features; no-op without a tagger."""
    if tagger is not None:
        feats = batch.region_targets if batch.region_targets is not None else batch.region_features
        batch.tag_ids, batch.tag_mask = tagger(feats, batch.region_valid)
    return batch


def build_online_regions(cfg: RegionConfig) -> torch.nn.Module | None:
    """The frozen model that computes regions on the training device, or None for shard/patches."""
    if cfg.source == "clip":
        return ClipRegions(cfg)
    if cfg.source == "detector":
        return DetectorRegions(cfg, cfg.max_regions)
    if cfg.source == "cnn":
        return CnnRegions(cfg, cfg.max_regions)
    if cfg.source in ("shard", "patches"):
        return None
    raise ValueError(f"unknown regions.source {cfg.source!r} (shard | patches | clip | detector | cnn)")


def fill_regions(batch: Batch, encoder: torch.nn.Module, region_mask_prob: float) -> Batch:
    """Run the frozen region model on a batch's images, then mask regions (as ``collate`` would)."""
    feats, boxes, valid, labels = encoder(batch.images)
    r = round_up(feats.shape[1])
    pad = r - feats.shape[1]
    if pad:
        feats, boxes = F.pad(feats, (0, 0, 0, pad)), F.pad(boxes, (0, 0, 0, pad))
        valid = F.pad(valid, (0, pad), value=False)
        labels = None if labels is None else F.pad(labels, (0, pad), value=-100)
    if batch.region_draws.shape[1] < r:
        raise ValueError(f"region model gives {r} regions but regions.max_regions is smaller")
    set_regions(batch, feats, box_locations(boxes), valid, labels, region_mask_prob)
    batch.images = None  # no longer needed; frees memory before the forward pass
    return batch
