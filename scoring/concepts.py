"""`ConceptScorer` (`--model imagenet-concepts`): an offline image-text scorer from two shipped models.

No CLIP: the image side is what an ImageNet classifier (EfficientNet-Lite0) sees, written in a
sentence encoder's (MiniLM) space; the text side is that encoder's embedding of the caption.
An image's embedding is the mean of the 1000 class prompts ("a photo of a {class}.") weighted
by the classifier's softened probabilities, minus the prompts' plain mean, L2-normalised; the
score of a pair is its cosine with the caption's embedding (ConSE, Norouzi et al. 2014, with
every class instead of the top 5).

The two changes from ConSE are fixed constants chosen on the Flickr8k *val* split
(`bench/learning`), never on its test split:
- the temperature `TEMPERATURE` = 2 spreads the probability over related classes, so a photo
  of a dog on a beach also says "seashore" instead of one breed;
- subtracting the prompts' mean removes the direction every prompt shares ("a photo of a"),
  which otherwise dominates every image embedding and makes them all alike.
On the Flickr8k test split this moves image-to-text R@1/5/10 from ConSE's 3.8 / 10.4 / 15.2 to
the figures in docs/learning.md.

The region tokens (`--regions`) are the classifier's 7 x 7 feature map cells (1280-d).
"""

from __future__ import annotations

import logging

import numpy as np

from lait.models import ImageClassifier, SentenceEncoder, imagenet_classes, load_image_classifier, load_sentence_encoder

log = logging.getLogger(__name__)

NAME = "imagenet-concepts"
WEIGHTS = "efficientnet-lite0+all-minilm-l6-v2"
TEMPERATURE = 2.0
PROMPT = "a photo of a {}."


class ConceptScorer:
    """The `ClipScorer` interface (encode_texts, encode_images, preprocess_cfg, patch_grid) over
    EfficientNet-Lite0 and MiniLM."""

    name = NAME
    pretrained = WEIGHTS

    def __init__(self, classifier: ImageClassifier, encoder: SentenceEncoder, device: str):
        import torch

        self.classifier, self.encoder, self.device = classifier, encoder, device
        prompts = encoder.encode([PROMPT.format(c) for c in imagenet_classes()])
        self.prompts = torch.from_numpy(prompts).to(device)
        self.prompt_mean = self.prompts.mean(0)
        size = classifier.image_size
        # Resize the short side, centre-crop: the classifier's own evaluation protocol.
        self.preprocess_cfg = {"size": size, "mode": "RGB", "mean": classifier.mean, "std": classifier.std,
                               "interpolation": "bicubic", "resize_mode": "shortest", "fill_color": 0}

    @property
    def embed_dim(self) -> int:
        return self.encoder.dim

    @property
    def image_size(self) -> tuple[int, int]:
        s = self.classifier.image_size
        return s, s

    @property
    def patch_grid(self) -> tuple[int, int]:
        s = self.classifier.image_size // 32
        return s, s

    def encode_texts(self, texts: list[str], batch_size: int = 256) -> np.ndarray:
        return self.encoder.encode(texts, batch_size)

    def concept_embeddings(self, logits):
        """(N, 1000) logits -> (N, 384) unit-length concept embeddings."""
        import torch
        import torch.nn.functional as F

        p = torch.softmax(logits.float() / TEMPERATURE, dim=-1)
        return F.normalize(p @ self.prompts - self.prompt_mean, dim=-1)

    def encode_images(self, pixels, *, tokens: bool = False):
        """Unit-length concept embeddings of uint8 pixels, host (N, H, W, 3) or device (N, 3, H, W)
        as `ClipScorer.to_input` takes them; with `tokens`, also the feature map cells
        (N, h * w, 1280), row-major."""
        import torch

        if isinstance(pixels, torch.Tensor):
            x = pixels.to(self.device).float().div_(255.0)
        else:
            x = torch.from_numpy(pixels).to(self.device).permute(0, 3, 1, 2).float().div_(255.0)
        with torch.inference_mode():
            fmap = self.classifier.feature_map(self.classifier.normalise(x))
            emb = self.concept_embeddings(self.classifier.classify(fmap.mean((2, 3)))).cpu().numpy()
            if tokens:
                cells = fmap.flatten(2).transpose(1, 2).float().cpu().numpy()
                return emb, cells
        return emb

    def encode_images_async(self, pixels, *, tokens: bool = False):
        from lait.scoring.pending import PendingImages

        out = self.encode_images(pixels, tokens=tokens)
        return PendingImages(out if tokens else (out,))


def load_concept_scorer(device: str) -> ConceptScorer:
    """Both models with their shipped weights (a `ModelUnavailable` naming the extra otherwise)."""
    scorer = ConceptScorer(load_image_classifier("efficientnet-lite0", device),
                           load_sentence_encoder("all-minilm-l6-v2", device), device)
    log.info("score: model %s (%s) on %s", NAME, WEIGHTS, device)
    return scorer
