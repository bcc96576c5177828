"""Settings of `lait build` (stage 5), loadable from the `build:` section of a pipeline YAML."""

from __future__ import annotations

from dataclasses import dataclass

from lait.config import ConfigError, StageConfig, setting

DEFAULT_SOURCE_PRIORITY = ["figcaption", "alt", "title", "og", "aria", "context"]

@dataclass
class BuildConfig(StageConfig):
    """Aggregation (LAIT stage 5): group, deduplicate, pick captions, threshold, write shards."""

    section = "build"

    samples_per_shard: int = setting(10000, "samples per WebDataset tar")
    min_score: float | None = setting(
        None, "drop images whose best text scores below this (LAION uses 0.28 with ViT-B/32); unset: no absolute threshold")
    top_fraction: float = setting(
        1.0, "keep only this fraction of the images with the best scores, after min-score (DataComp-style)")
    max_texts_per_image: int = setting(
        12, "drop an image (and its duplicates) carrying more distinct texts than this: logos, banners (0: off)")
    max_pages_per_image: int = setting(
        50, "drop an image found on more distinct pages than this: site logos and chrome (0: off)")
    max_images_per_text: int = setting(
        10, "drop a text attached to more distinct images than this: boilerplate (0: off)")
    n_alternatives: int = setting(4, "next-best distinct texts kept as alternatives in KEY.json")
    max_candidates: int = setting(32, "at most this many scored candidates listed in KEY.json")
    phash_threshold: int = setting(
        2, "images whose 64-bit perceptual hashes differ in at most this many bits are one image (-1: off)")
    use_embedding_dups: bool = setting(True, "also merge the near-duplicate pairs stage 4 found from embeddings")
    near_dup_max_phash: int = setting(
        10, "merge an embedding near-duplicate pair only when the perceptual hashes also differ in at most "
            "this many bits (a pixel check: weak scorers put distinct photos close)")
    source_priority: list[str] = setting(
        list(DEFAULT_SOURCE_PRIORITY), "tie-break between equal scores, best source first")
    jpeg_quality: int = setting(95, "quality when an image that is not a JPEG is re-encoded to KEY.jpg")
    regions: bool = setting(True, "write KEY.regions.npy/boxes.npy/labels.npy when stage 4 stored region features")

    def validate(self) -> None:
        super().validate()
        if self.samples_per_shard < 1:
            raise ConfigError("samples_per_shard must be >= 1")
        if not 0.0 < self.top_fraction <= 1.0:
            raise ConfigError(f"top_fraction must be in (0, 1], got {self.top_fraction}")
        for name in ("max_texts_per_image", "max_pages_per_image", "max_images_per_text",
                     "n_alternatives", "max_candidates"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if not 0 <= self.near_dup_max_phash <= 64:
            raise ConfigError("near_dup_max_phash must be between 0 and 64 bits")
        if not -1 <= self.phash_threshold <= 16:
            raise ConfigError("phash_threshold must be between -1 (off) and 16 bits")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError("jpeg_quality must be between 1 and 100")

    def content(self) -> dict:
        """The settings the shards depend on (for the rebuild fingerprint): all but the `run` ones."""
        return self.output_settings()
