"""MTCNN (Zhang et al. 2016) run fast on one CPU thread, on the weights facenet-pytorch ships.

The cascade is the one facenet-pytorch runs (a P-Net over an image pyramid, R-Net on 24 px crops
of its candidates, O-Net on 48 px crops of R-Net's, non-maximum suppression between them), with
the package's own three networks and weights. What differs is how the work is done (issue 47):
facenet-pytorch spends ~60 ms on a 224 px photo, about 0.4 GMAC of convolutions, because

- torch's NCHW max-pool is slow on these few-channel maps (a third of its time): here the maps are
  kept channels-last and pooled with strided maxima, which give the same values;
- each candidate is cut out and resized on its own (a hundred `interpolate` calls per photo),
  and each pyramid level is an `interpolate(mode="area")` of a channels-first copy: here every
  resize, crops and levels alike, is read off one integer summed-area table of the picture, with
  the same cells as torch's area resize (the sums are exact, so the values are too);
- R-Net and O-Net see their candidates in chunks (CHUNK): a crowd gives R-Net over a thousand,
  whose activations at once (85 MB) were mapped afresh and faulted in page by page.

`detect(image)` gives ([x0, y0, x1, y1] in pixels, probability) per face, as facenet's `detect`.
"""

from __future__ import annotations

import math
from functools import reduce
from typing import Any

import numpy as np

THRESHOLDS = (0.6, 0.7, 0.5)  # P-, R- and O-Net: facenet-pytorch's defaults
FACTOR = 0.709  # between pyramid levels
NORM_MEAN, NORM_SCALE = 127.5, 0.0078125
CHUNK = 128  # candidates per R-Net / O-Net call


def _pool(x: Any, k: int, s: int) -> Any:
    """Max-pool of an NHWC tensor, torch's ceil_mode=True: windows may run off the far edges."""
    import torch

    _, h, w, _ = x.shape
    oh, ow = -(-(h - k) // s) + 1, -(-(w - k) // s) + 1
    ph, pw = (oh - 1) * s + k - h, (ow - 1) * s + k - w
    if ph or pw:  # never negative: the last window starts inside the map
        x = torch.nn.functional.pad(x, (0, 0, 0, pw, 0, ph), value=-math.inf)
    x = reduce(torch.maximum, [x[:, :, j:j + (ow - 1) * s + 1:s] for j in range(k)])
    return reduce(torch.maximum, [x[:, j:j + (oh - 1) * s + 1:s] for j in range(k)])


class _Layers:
    """A network's convolutions and PReLUs applied to NHWC tensors, channels-last inside."""

    def __init__(self, net: Any):
        import torch

        self.w = {n: p.detach().contiguous(memory_format=torch.channels_last) if p.dim() == 4 else p.detach()
                  for n, p in net.named_parameters()}

    def conv(self, x: Any, name: str) -> Any:
        import torch

        y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), self.w[f"{name}.weight"], self.w[f"{name}.bias"])
        return y.permute(0, 2, 3, 1)  # a view: channels-last memory is NHWC

    def prelu(self, x: Any, name: str) -> Any:
        """In place: `x` is always a fresh output of the layer before."""
        neg = x.clamp(max=0).mul_(self.w[f"{name}.weight"])
        return x.clamp_(min=0).add_(neg)

    def dense(self, x: Any, name: str) -> Any:
        import torch

        return torch.nn.functional.linear(x, self.w[f"{name}.weight"], self.w[f"{name}.bias"])


class FastMTCNN:
    """facenet-pytorch's MTCNN networks and weights, run as described above."""

    def __init__(self, min_face: int = 12, thresholds: tuple[float, float, float] = THRESHOLDS):
        from facenet_pytorch.models.mtcnn import ONet, PNet, RNet  # loads the package's data/*.pt

        self.min_face, self.thresholds = min_face, thresholds
        self.p, self.r, self.o = _Layers(PNet()), _Layers(RNet()), _Layers(ONet())

    # -- the three networks -------------------------------------------------------------------
    def pnet(self, x: Any) -> tuple[Any, Any]:
        """(face probability H x W, box offsets H x W x 4) of an NHWC image of one picture."""
        import torch

        p = self.p
        x = _pool(p.prelu(p.conv(x, "conv1"), "prelu1"), 2, 2)
        x = p.prelu(p.conv(x, "conv2"), "prelu2")
        x = p.prelu(p.conv(x, "conv3"), "prelu3")
        logits = p.conv(x, "conv4_1")[0]
        return torch.sigmoid(logits[..., 1] - logits[..., 0]), p.conv(x, "conv4_2")[0]

    def rnet(self, x: Any) -> tuple[Any, Any]:
        import torch

        r = self.r
        x = _pool(r.prelu(r.conv(x, "conv1"), "prelu1"), 3, 2)
        x = _pool(r.prelu(r.conv(x, "conv2"), "prelu2"), 3, 2)
        x = r.prelu(r.conv(x, "conv3"), "prelu3")
        x = x.permute(0, 2, 1, 3).reshape(len(x), -1)  # the Caffe weights flatten W, H, C
        x = r.prelu(r.dense(x, "dense4"), "prelu4")
        logits = r.dense(x, "dense5_1")
        return torch.sigmoid(logits[:, 1] - logits[:, 0]), r.dense(x, "dense5_2")

    def onet(self, x: Any) -> tuple[Any, Any]:
        import torch

        o = self.o
        x = _pool(o.prelu(o.conv(x, "conv1"), "prelu1"), 3, 2)
        x = _pool(o.prelu(o.conv(x, "conv2"), "prelu2"), 3, 2)
        x = _pool(o.prelu(o.conv(x, "conv3"), "prelu3"), 2, 2)
        x = o.prelu(o.conv(x, "conv4"), "prelu4")
        x = x.permute(0, 2, 1, 3).reshape(len(x), -1)
        x = o.prelu(o.dense(x, "dense5"), "prelu5")
        logits = o.dense(x, "dense6_1")
        return torch.sigmoid(logits[:, 1] - logits[:, 0]), o.dense(x, "dense6_2")

    # -- the cascade ----------------------------------------------------------------------------
    def detect(self, image: Any) -> list[tuple[list[float], float]]:
        import torch

        with torch.inference_mode():
            rgb = torch.from_numpy(np.asarray(image.convert("RGB"), np.uint8).copy())
            # The summed-area table every resize below is read off: exact in int32 up to 2^31
            # (8.4 M pixels of 255; stage 2 searches at most 640 px a side).
            sat = torch.nn.functional.pad(rgb.int().cumsum(0).cumsum(1).int(), (0, 0, 1, 0, 1, 0))
            boxes = self._stage1(sat)
            if len(boxes):
                boxes = self._refine(sat, boxes, 24, self.rnet, self.thresholds[1])
                if len(boxes):
                    boxes = self._refine(sat, boxes, 48, self.onet, self.thresholds[2], final=True)
            return [([float(v) for v in b[:4]], float(b[4])) for b in boxes.tolist()]

    def _stage1(self, sat: Any) -> Any:
        """P-Net over the pyramid: squared candidate boxes (x0, y0, x1, y1, score)."""
        import torch
        from torchvision.ops import nms

        h, w = sat.shape[0] - 1, sat.shape[1] - 1
        scale, side = 12.0 / self.min_face, min(h, w) * 12.0 / self.min_face
        found = []
        while side >= 12:
            size = (int(h * scale + 1), int(w * scale + 1))
            level = (_area_resize(sat, *size) - NORM_MEAN) * NORM_SCALE
            prob, reg = self.pnet(level[None])
            ys, xs = torch.nonzero(prob >= self.thresholds[0], as_tuple=True)
            if len(ys):
                cells = torch.stack([xs, ys], 1).float()
                b = torch.cat([((2 * cells + 1) / scale).floor(), ((2 * cells + 12) / scale).floor(),
                               prob[ys, xs, None], reg[ys, xs]], 1)
                found.append(b[nms(b[:, :4], b[:, 4], 0.5)])
            scale, side = scale * FACTOR, side * FACTOR
        if not found:
            return torch.zeros(0, 5)
        b = torch.cat(found)
        b = b[nms(b[:, :4], b[:, 4], 0.7)]
        wh = (b[:, 2:4] - b[:, 0:2]).repeat(1, 2)
        return _square(torch.cat([b[:, :4] + b[:, 5:9] * wh, b[:, 4:5]], 1))

    def _refine(self, sat: Any, boxes: Any, side: int, net: Any, threshold: float, final: bool = False) -> Any:
        """Score crops of `boxes` with `net`; keep, regress and suppress as the cascade does."""
        import torch
        from torchvision.ops import nms

        h, w = sat.shape[0] - 1, sat.shape[1] - 1
        x0 = boxes[:, 0].trunc().clamp(min=1).long() - 1
        y0 = boxes[:, 1].trunc().clamp(min=1).long() - 1
        x1 = boxes[:, 2].trunc().clamp(max=w).long()
        y1 = boxes[:, 3].trunc().clamp(max=h).long()
        ok = (x1 > x0) & (y1 > y0)
        boxes, rois = boxes[ok], torch.stack([x0, y0, x1, y1], 1)[ok]
        if not len(boxes):
            return boxes
        # In chunks: a crowd gives R-Net a thousand candidates or more, whose activations at once
        # (85 MB at 1,571) are mapped afresh and faulted in page by page, and miss every cache.
        outs = [net((_area_crops(sat, rois[i:i + CHUNK], side) - NORM_MEAN) * NORM_SCALE)
                for i in range(0, len(rois), CHUNK)]
        prob, reg = torch.cat([p for p, _ in outs]), torch.cat([r for _, r in outs])
        keep = prob > threshold
        boxes = torch.cat([boxes[keep, :4], prob[keep, None]], 1)
        reg = reg[keep]
        if not final:
            keep = nms(boxes[:, :4], boxes[:, 4], 0.7)
            return _square(_regress(boxes[keep], reg[keep]))
        boxes = _regress(boxes, reg)
        return boxes[_nms_min(boxes.numpy(), 0.7)]


def _area_crops(sat: Any, rois: Any, n: int, nw: int | None = None) -> Any:
    """The (K, n, nw, 3) crops [x0, x1) x [y0, y1) of the picture whose summed-area table is `sat`,
    each resized to n x nw (default n x n) by area averaging: the cells of torch's adaptive
    average pooling (what `interpolate(mode="area")` does, one crop at a time in facenet-pytorch),
    read off the table."""
    import torch

    nw = nw or n
    i, j = torch.arange(n), torch.arange(nw)
    x0, y0, x1, y1 = (rois[:, k:k + 1] for k in range(4))
    r0, r1 = y0 + i * (y1 - y0) // n, y0 + ((i + 1) * (y1 - y0) + n - 1) // n
    c0, c1 = x0 + j * (x1 - x0) // nw, x0 + ((j + 1) * (x1 - x0) + nw - 1) // nw
    r0, r1, c0, c1 = r0[:, :, None], r1[:, :, None], c0[:, None, :], c1[:, None, :]
    width = sat.shape[1]
    corners = torch.stack([r1 * width + c1, r0 * width + c1, r1 * width + c0, r0 * width + c0])
    s11, s01, s10, s00 = sat.reshape(-1, 3).index_select(0, corners.reshape(-1)).view(4, len(rois), n, nw, 3)
    return (s11 - s01 - s10 + s00).float() / ((r1 - r0) * (c1 - c0))[..., None].float()


def _area_resize(sat: Any, oh: int, ow: int) -> Any:
    """The (oh, ow, 3) picture whose summed-area table is `sat`, resized by area averaging with
    the cells of `interpolate(mode="area")` (adaptive average pooling), as facenet-pytorch builds
    its pyramid; one gather instead of torch's per-cell loops over a channels-first copy."""
    import torch

    h, w = sat.shape[0] - 1, sat.shape[1] - 1
    return _area_crops(sat, torch.tensor([[0, 0, w, h]]), oh, ow)[0]


def _regress(boxes: Any, reg: Any) -> Any:
    out = boxes.clone()
    out[:, :4] += reg * (boxes[:, 2:4] - boxes[:, 0:2] + 1).repeat(1, 2)
    return out


def _square(boxes: Any) -> Any:
    """Each box grown to a square on its centre (the next network's input is square)."""
    import torch

    wh = boxes[:, 2:4] - boxes[:, 0:2]
    side = wh.max(1).values[:, None]
    start = boxes[:, 0:2] + wh * 0.5 - side * 0.5
    return torch.cat([start, start + side, boxes[:, 4:]], 1)


def _nms_min(b: np.ndarray, threshold: float) -> list[int]:
    """Suppression by the overlap over the smaller box (O-Net's last step), best score first."""
    area = (b[:, 2] - b[:, 0] + 1) * (b[:, 3] - b[:, 1] + 1)
    order = list(np.argsort(b[:, 4], kind="stable")[::-1])
    keep = []
    while order:
        i, rest = order[0], np.array(order[1:], dtype=np.int64)
        keep.append(int(i))
        if not len(rest):
            break
        iw = np.maximum(0.0, np.minimum(b[i, 2], b[rest, 2]) - np.maximum(b[i, 0], b[rest, 0]) + 1)
        ih = np.maximum(0.0, np.minimum(b[i, 3], b[rest, 3]) - np.maximum(b[i, 1], b[rest, 1]) + 1)
        order = list(rest[iw * ih / np.minimum(area[i], area[rest]) <= threshold])
    return keep
