"""Settings of `lait build` (stage 5), loadable from the `build:` section of a pipeline YAML, and
of `lait select`, which writes other shards from the pool a build scored and grouped."""

from __future__ import annotations

from dataclasses import dataclass

from lait.build.faces import DEFAULT_FACE_MODEL, DEFAULT_MIN_FACE_SCORE
from lait.build.resize import ENCODE_FORMATS, RESIZE_MODES, ImageOptions
from lait.config import ConfigError, StageConfig, setting

DEFAULT_SOURCE_PRIORITY = ["figcaption", "alt", "title", "og", "aria", "context"]

@dataclass
class ShardConfig(StageConfig):
    """How samples are written into WebDataset tars (img2dataset's names for the image options)."""

    samples_per_shard: int = setting(10000, "samples per WebDataset tar")
    resize_mode: str = setting("no", "resize images as img2dataset does: no, keep_ratio (smaller side to "
                               "image_size), center_crop (then a square), border (larger side, then white "
                               "borders to a square), keep_ratio_largest (larger side)", choices=list(RESIZE_MODES))
    image_size: int = setting(256, "the side resize_mode sizes images to")
    resize_only_if_bigger: bool = setting(False, "resize only images whose side is above image_size")
    encode_format: str = setting("jpg", "image format in the tars; an image already in it and not resized is "
                                 "copied as fetched", choices=list(ENCODE_FORMATS))
    encode_quality: int = setting(95, "quality of re-encoded images (png: zlib level 0-9)")
    face_model: str = setting(DEFAULT_FACE_MODEL, "face detector that searches every picture as it is written into a "
                              "shard, at the size it ships (searches kept in faces/ and reused), or none: nothing "
                              "searched or blurred", choices=[DEFAULT_FACE_MODEL, "none"])
    min_face_score: float = setting(DEFAULT_MIN_FACE_SCORE, "faces the detector scores at least this are blurred and listed in "
                                    "KEY.json's face_bboxes (MTCNN at 0.8: precision 0.98, recall 0.91 on 112 "
                                    "faces labelled by hand on real photos, docs/safety.md)")
    blur_faces: bool = setting(True, "blur the faces found in the tars, as DataComp did; --no-blur-faces keeps "
                               "them sharp (the boxes stay in KEY.json either way)")
    regions: bool = setting(True, "write KEY.regions.npy/boxes.npy/labels.npy when stage 4 stored region features")

    def image_options(self) -> ImageOptions:
        return ImageOptions(self.resize_mode, self.image_size, self.resize_only_if_bigger, self.encode_format,
                            self.encode_quality, self.blur_faces, self.face_model, self.min_face_score)

    def validate(self) -> None:
        super().validate()
        self.check_choices()
        if self.samples_per_shard < 1:
            raise ConfigError("samples_per_shard must be >= 1")
        try:
            self.image_options().validate()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if self.face_model != "none":
            from lait.build.faces import check_face_model

            check_face_model(self.face_model)  # before any shard: one line, not one per worker


@dataclass
class EvalExclusionConfig(ShardConfig):
    """Decontamination (`lait.build.decon`): the images of an evaluation set kept out of the shards."""

    # The set's files are fingerprinted by their content (`EvalSet.digest`, in the fingerprint's
    # extra), not by where they lie: a moved set rebuilds nothing, a changed one rebuilds.
    exclude_eval: str = setting(
        "", "drop images that show a picture of this evaluation set (resized, re-encoded or cropped by a few "
            "per cent), each as build/eval_overlap: a folder of images (walked recursively) or a Karpathy-style "
            "JSON", metavar="DIR|KARPATHY.json", run=True)
    exclude_eval_split: list[str] = setting(
        [], "only these splits of the --exclude-eval JSON (default: all)", metavar="SPLIT", run=True)
    exclude_eval_root: str = setting(
        "", "folder the --exclude-eval JSON's image paths are relative to (default: the JSON's)", metavar="DIR",
        run=True)
    eval_max_phash: int = setting(
        8, "an image is an evaluation image's candidate copy when its perceptual hash is within this many bits of "
           "the image's or of one of its 3 per cent crops' (docs/shards.md)")
    eval_max_diff: float = setting(
        46.0, "and a copy when, at the best of 100 alignments (crops of 0 to 4.5 per cent per axis), no cell "
              "of the two 16x16 colour thumbnails differs by more than this (0-255)")

    def output_settings(self) -> dict:
        """Without --exclude-eval its bounds change nothing written: they stay out of the
        fingerprint, so that a dataset built before they existed is not rebuilt for them."""
        out = super().output_settings()
        if not self.exclude_eval:
            out.pop("eval_max_phash", None)
            out.pop("eval_max_diff", None)
        return out

    def validate(self) -> None:
        super().validate()
        if (self.exclude_eval_split or self.exclude_eval_root) and not self.exclude_eval:
            raise ConfigError("--exclude-eval-split and --exclude-eval-root need --exclude-eval")
        if not 0 <= self.eval_max_phash <= 32:
            raise ConfigError("eval_max_phash must be between 0 and 32 bits")
        if not 0.0 <= self.eval_max_diff <= 255.0:  # written so refuses NaN
            raise ConfigError("eval_max_diff must be between 0 and 255")


def check_top_fraction(top_fraction: float) -> None:
    if not 0.0 < top_fraction <= 1.0:
        raise ConfigError(f"top_fraction must be in (0, 1], got {top_fraction}")


def check_min_score(min_score: float | None) -> None:
    """Scores are cosine similarities (stage 4): a threshold outside [-1, 1] keeps nothing or
    everything, and is a mistake (issue 51: `--min-score 2` replaced 248 samples with none)."""
    if min_score is not None and not -1.0 <= min_score <= 1.0:  # also refuses NaN
        raise ConfigError(f"min_score must be between -1 and 1, got {min_score}: scores are cosine similarities "
                          f"(LAION keeps ViT-B/32 pairs from 0.28)")


@dataclass
class BuildConfig(EvalExclusionConfig):
    """Aggregation (LAIT stage 5): group, deduplicate, pick captions, threshold, write shards."""

    section = "build"

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
    max_candidates: int = setting(32, "at most this many scored candidates listed in KEY.json (>= 1: the caption's)")
    phash_threshold: int = setting(
        2, "images whose 64-bit perceptual hashes differ in at most this many bits are one image (-1: off)")
    use_embedding_dups: bool = setting(True, "also merge the near-duplicate pairs stage 4 found from embeddings")
    near_dup_max_phash: int = setting(
        10, "merge an embedding near-duplicate pair only when the perceptual hashes also differ in at most "
            "this many bits (a pixel check: weak scorers put distinct photos close)")
    near_dup_max_diff: float = setting(
        24.0, "pixel check of every duplicate the perceptual hashes or the embeddings propose (other than equal "
              "bytes): no cell of the two 16x16 colour thumbnails, brightness matched, may differ by more than "
              "this (0-255); phashes collide on simple pictures")
    source_priority: list[str] = setting(
        list(DEFAULT_SOURCE_PRIORITY), "tie-break between equal scores, best source first")
    key_order: str = setting(
        "build", "how samples are keyed and laid into shards: build (lait's order, shards mixed by URL hash) or "
                 "input (img2dataset's: a sample's key is its URL list row's position, shard number then index, "
                 "so that it joins back to its row; every sample must come from a URL list)",
        choices=["build", "input"])

    def validate(self) -> None:
        super().validate()
        check_top_fraction(self.top_fraction)
        check_min_score(self.min_score)
        for name in ("max_texts_per_image", "max_pages_per_image", "max_images_per_text"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.max_candidates < 1:
            raise ConfigError("max_candidates must be >= 1: KEY.json lists at least the caption's candidate")
        if not 0 <= self.near_dup_max_phash <= 64:
            raise ConfigError("near_dup_max_phash must be between 0 and 64 bits")
        if not 0.0 <= self.near_dup_max_diff <= 255.0:  # also refuses NaN
            raise ConfigError("near_dup_max_diff must be between 0 and 255")
        if not -1 <= self.phash_threshold <= 16:
            raise ConfigError("phash_threshold must be between -1 (off) and 16 bits")

    def content(self) -> dict:
        """The settings the shards depend on (for the rebuild fingerprint): all but the `run` ones,
        so every setting added here (resize_mode, encode_format, ...) is part of it."""
        return self.output_settings()


@dataclass
class SelectConfig(EvalExclusionConfig):
    """`lait select`: new shards from the scored pool of a built work directory, without rescoring."""

    section = "select"

    out: str = setting("", "folder for the selected shards (NNNNN.tar, sidecars, sizes.json, uids.npy)", run=True)
    min_score: float | None = setting(None, "keep pictures whose best text scores at least this")
    top_fraction: float = setting(1.0, "keep this fraction of the best-scoring pictures, after min-score and uids")
    uids: str = setting("", "keep only these samples: a DataComp subset file (.npy of sorted u8,u8 uids) "
                        "or a text file of hex uids, one a line", metavar="FILE")
    overwrite: bool = setting(False, "replace what an earlier, different selection wrote into --out", run=True)
    recipe: list[str] = setting(
        [], "apply a curation recipe (a shipped name or a YAML file; several: their intersection, in order) "
            "before --min-score and --top-fraction; `lait select --help` lists the shipped ones", metavar="NAME|FILE")

    def validate(self) -> None:
        super().validate()
        if not self.out:
            raise ConfigError("--out is required")
        check_top_fraction(self.top_fraction)
        check_min_score(self.min_score)

    def content(self) -> dict:
        """The settings the selection's shards depend on: all but the `run` ones (the uid file's
        content is fingerprinted too, by `lait.build.select.fingerprint`)."""
        return self.output_settings()


@dataclass
class DocumentsConfig(ShardConfig):
    """Interleaved documents (`lait documents`, issue 63): each page's main text with its pictures,
    as MMC4 JSON in WebDataset tars and as OBELICS-style Parquet, beside the pair shards."""

    section = "documents"

    out: str = setting("", "folder for the documents (default WORK/documents): NNNNN.tar, NNNNN.parquet, "
                       "stats.json", run=True)
    samples_per_shard: int = setting(1000, "documents per tar and Parquet file")
    min_sim: float = setting(0.15, "a picture whose best sentence scores below this (stage 4's cosine) leaves "
                             "the document")
    min_words: int = setting(50, "documents with fewer words are dropped (documents/too_few_words)")
    min_words_per_image: int = setting(10, "documents with more than one picture per this many words are "
                                       "dropped (documents/too_many_images)")
    max_repeated_share: float = setting(0.3, "documents where more than this share of the paragraphs repeat "
                                        "another are dropped (documents/repeated_paragraphs)")
    max_overlap: float = setting(0.8, "a document whose word 5-grams overlap an earlier one's this much (Jaccard, "
                                 "MinHash) is dropped (documents/near_duplicate); 1 keeps all")

    def validate(self) -> None:
        super().validate()
        if self.min_words < 0 or self.min_words_per_image < 1:
            raise ConfigError("min_words must be >= 0 and min_words_per_image >= 1")
        if not 0.0 <= self.max_repeated_share <= 1.0 or not 0.0 < self.max_overlap <= 1.0:
            raise ConfigError("max_repeated_share must be in [0, 1] and max_overlap in (0, 1]")
