"""Arrow schemas of the tables that pass between stages (DESIGN.md, "Data between stages").

Each table is a folder of Parquet parts inside a work directory. The schema is the contract:
a writer validates every row against it, so a stage cannot silently drift a column.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

TIMESTAMP = pa.timestamp("us", tz="UTC")

PAGES = pa.schema(
    [
        pa.field("url", pa.string(), nullable=False),
        pa.field("status", pa.int32(), nullable=False),
        pa.field("fetched_at", TIMESTAMP, nullable=False),
        pa.field("headers", pa.map_(pa.string(), pa.string())),
        pa.field("content_type", pa.string()),
        # Raw page bytes as served; Parquet compresses the column (zstd).
        pa.field("html", pa.binary()),
        pa.field("encoding", pa.string()),
        pa.field("depth", pa.int32()),
        pa.field("referer", pa.string()),
        pa.field("error", pa.string()),
        # The licence the page declares: a rel="license" URL, a licence meta text, a CC link.
        pa.field("license", pa.string()),
    ]
)

IMAGES = pa.schema(
    [
        pa.field("image_url", pa.string(), nullable=False),
        pa.field("page_url", pa.string()),
        pa.field("bytes", pa.binary()),
        pa.field("mime", pa.string()),
        pa.field("status", pa.int32(), nullable=False),
        pa.field("fetched_at", TIMESTAMP, nullable=False),
        pa.field("error", pa.string()),
    ]
)

IMAGES_OK = pa.schema(
    list(IMAGES)
    + [
        pa.field("width", pa.int32(), nullable=False),
        pa.field("height", pa.int32(), nullable=False),
        pa.field("format", pa.string(), nullable=False),  # of the file as fetched (PNG, WEBP, ...)
        # SHA-256 of `bytes`, the bytes stored (a re-encoded JPEG unless the fetched JPEG is kept).
        pa.field("sha256", pa.string(), nullable=False),
        # SHA-256 of the file as fetched: provenance and hash lists; equal to sha256 when it was
        # kept as it is. Null in parts written before it existed, whose sha256 is this digest.
        pa.field("fetched_sha256", pa.string()),
        # 64-bit perceptual hash as 16 hex digits (imagehash.phash).
        pa.field("phash", pa.string(), nullable=False),
        # Probability that the image is unsafe (stage 2's model, LAION's punsafe); null: not scored.
        pa.field("punsafe", pa.float32()),
        # Faces a detector found in the stored image, [x0, y0, x1, y1] normalised to it
        # (img2dataset's face_bboxes), and their scores; null: not searched. lait's stage 2 no
        # longer searches (stage 5 searches what ships, `faces/`); other writers may fill them.
        pa.field("face_bboxes", pa.list_(pa.list_(pa.float32()))),
        pa.field("face_scores", pa.list_(pa.float32())),
        # The licence or rights the image file declares for itself (XMP cc:license,
        # xmpRights:WebStatement, dc:rights; IPTC Copyright Notice); null: none.
        pa.field("rights", pa.string()),
    ]
)

TEXT = pa.struct(
    [
        pa.field("text", pa.string(), nullable=False),
        # alt, title, figcaption, aria, og, context; list (a URL list's caption)
        pa.field("source", pa.string(), nullable=False),
        pa.field("lang", pa.string()),
    ]
)

CANDIDATES = pa.schema(
    [
        pa.field("page_url", pa.string(), nullable=False),
        pa.field("image_url", pa.string(), nullable=False),
        pa.field("texts", pa.list_(TEXT), nullable=False),
        # The licence the page declares (pages.license), carried to the sample's JSON.
        pa.field("license", pa.string()),
        # The licence the page declares for this image alone (a rel="license" link in its <figure>).
        pa.field("image_license", pa.string()),
    ]
)

SCORED = pa.schema(
    [
        pa.field("image_url", pa.string(), nullable=False),
        pa.field("page_url", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("lang", pa.string()),
        pa.field("score", pa.float32(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("pretrained", pa.string()),
        # Row index of this pair's embeddings in the partition's embedding arrays.
        pa.field("image_emb_ref", pa.int64()),
        pa.field("text_emb_ref", pa.int64()),
        # The licence the page declares (candidates.license).
        pa.field("license", pa.string()),
        # The licence the page declares for this image alone (candidates.image_license).
        pa.field("image_license", pa.string()),
    ]
)

REJECTED = pa.schema(
    [
        # "stage/rule", e.g. "filter/min_side"
        pa.field("reason", pa.string(), nullable=False),
        pa.field("image_url", pa.string()),
        pa.field("page_url", pa.string()),
        pa.field("text", pa.string()),
        pa.field("detail", pa.string()),
    ]
)


# -- tables a stage writes for itself and the stages after it --------------------------------

# warc_links/ (ingest-warc): image references of archived pages, with their alt and title texts.
WARC_LINKS = pa.schema([
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("alt", pa.string()),
    pa.field("title", pa.string()),
    pa.field("source", pa.string(), nullable=False),
    pa.field("fetched_at", TIMESTAMP, nullable=False),
    pa.field("warc_file", pa.string()),
    # What a WAT record says of the page (source "wat"): its <title> and its declared language
    # (<html lang>), as Common Crawl's WAT carries them; stage 3 reads the archived page itself.
    pa.field("page_title", pa.string()),
    pa.field("page_lang", pa.string()),
])

# url_list/ (download): the usable rows of URL lists, one per image URL, with their captions.
URL_LIST = pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("caption", pa.string()),
    pa.field("page_url", pa.string()),
    # The list's columns kept with --save-additional-columns, as a JSON object.
    pa.field("extra", pa.string()),
    pa.field("list_file", pa.string(), nullable=False),
    pa.field("row", pa.int64(), nullable=False),
])

# retry_queue/ (`--retry-failed` of a crawl): images whose transient failure was taken out to
# be fetched again; the crawl has no table of references to fetch them from (lait.crawler.retry).
RETRY_QUEUE = pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("page_url", pa.string()),
])

# image_embs/ (score): one fp16 L2-normalised embedding per scored image.
IMAGE_EMBS = pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("sha256", pa.string()),
    pa.field("dim", pa.int32(), nullable=False),
    pa.field("emb", pa.binary(), nullable=False),
])

# text_embs/ (score): one per distinct text of a partition.
TEXT_EMBS = pa.schema([
    pa.field("text", pa.string(), nullable=False),
    pa.field("dim", pa.int32(), nullable=False),
    pa.field("emb", pa.binary(), nullable=False),
])

# regions/ (score --regions): pooled patch features (fp16 n x dim) and boxes (fp32 n x 4).
REGIONS = pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("n", pa.int32(), nullable=False),
    pa.field("dim", pa.int32(), nullable=False),
    pa.field("features", pa.binary(), nullable=False),
    pa.field("boxes", pa.binary(), nullable=False),
])

# region_labels/ (score --regions): each region's codebook class (int32 n).
REGION_LABELS = pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("n", pa.int32(), nullable=False),
    pa.field("labels", pa.binary(), nullable=False),
])

# near_dups/ (score): image pairs whose embeddings are near-duplicates, url_a < url_b.
NEAR_DUPS = pa.schema([
    pa.field("image_url_a", pa.string(), nullable=False),
    pa.field("image_url_b", pa.string(), nullable=False),
    pa.field("cosine", pa.float32(), nullable=False),
])

# build_images/ (build, pass 1): one row per image URL with scored texts, where its bytes are.
BUILD_CANDIDATE = pa.struct([
    pa.field("text", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("lang", pa.string()),
    pa.field("score", pa.float32(), nullable=False),
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("model", pa.string()),
    pa.field("pretrained", pa.string()),
    pa.field("license", pa.string()),
    pa.field("image_license", pa.string()),
])

BUILD_IMAGES = pa.schema([
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),  # images_ok's: of the bytes stored
    pa.field("fetched_sha256", pa.string()),  # images_ok's: of the file as fetched; null: as sha256
    pa.field("phash", pa.string(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("format", pa.string(), nullable=False),
    pa.field("punsafe", pa.float32()),  # images_ok's; null: not scored
    pa.field("face_bboxes", pa.list_(pa.list_(pa.float32()))),  # images_ok's; null: not searched
    pa.field("rights", pa.string()),  # images_ok's: what the image file declares; null: none
    # Where the bytes are: images_ok part file name, row group, row inside the group.
    pa.field("src_file", pa.string(), nullable=False),
    pa.field("row_group", pa.int32(), nullable=False),
    pa.field("row_index", pa.int32(), nullable=False),
    pa.field("candidates", pa.list_(BUILD_CANDIDATE), nullable=False),
])

# build_plan/ (build, pass 2): one row per final sample, partitioned by shard number.
BUILD_PLAN = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("shard", pa.int32(), nullable=False),
    pa.field("image_url", pa.string(), nullable=False),
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("caption", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("lang", pa.string()),
    pa.field("score", pa.float32(), nullable=False),
    pa.field("width", pa.int32(), nullable=False),
    pa.field("height", pa.int32(), nullable=False),
    pa.field("format", pa.string(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),
    pa.field("phash", pa.string(), nullable=False),
    pa.field("src_file", pa.string(), nullable=False),
    pa.field("row_group", pa.int32(), nullable=False),
    pa.field("row_index", pa.int32(), nullable=False),
    pa.field("n_candidates", pa.int32(), nullable=False),
    pa.field("n_duplicates", pa.int32(), nullable=False),
    # KEY.json, decided by the global pass (a JSON object as text).
    pa.field("meta", pa.string(), nullable=False),
])

# build_failed/ (build, pass 2): the URL list rows that became no sample, partitioned by the shard
# whose sidecar and _stats.json list them (img2dataset's failed rows; `lait.build.books`).
BUILD_FAILED = pa.schema([
    pa.field("key", pa.string(), nullable=False),
    pa.field("shard", pa.int32(), nullable=False),
    pa.field("image_url", pa.string()),
    pa.field("page_url", pa.string()),
    pa.field("caption", pa.string()),
    pa.field("status", pa.string(), nullable=False),  # failed_to_download, failed_to_resize
    pa.field("error_message", pa.string(), nullable=False),
    pa.field("reason", pa.string()),  # lait's stage/rule; null when nothing recorded one
    pa.field("list_file", pa.string(), nullable=False),
    pa.field("row", pa.int64(), nullable=False),
    pa.field("extra", pa.string()),  # the list's extra columns, typed, as a JSON object
])

# pool/ (build, pass 2): every picture that passed the build's rules but the score thresholds,
# with its planned sample; partitioned by image URL, rows in shard order. `lait select` cuts
# subsets from it. `uid` is the sample's DataComp-style id (docs/shards.md).
POOL = pa.schema(
    [pa.field("uid", pa.string(), nullable=False)]
    + [f for f in BUILD_PLAN if f.name not in ("key", "shard")]
)


@dataclass(frozen=True)
class Table:
    """A table of the work directory: its folder name, schema and partitioning key."""

    name: str
    schema: pa.Schema
    key: str


# faces/ (stage 5's face search, `lait.build.faces`): a cache of searches, partitioned by the
# stored bytes' digest; a picture's boxes for one search key, whatever URL or build it came from.
FACES = pa.schema([
    pa.field("sha256", pa.string(), nullable=False),  # of the bytes stored in images_ok/ (what was searched)
    pa.field("key", pa.string(), nullable=False),  # detector, version, threshold, search size, resize
    # [x0, y0, x1, y1] normalised to the shipped picture, and their scores; [] for none found.
    pa.field("face_bboxes", pa.list_(pa.list_(pa.float32())), nullable=False),
    pa.field("face_scores", pa.list_(pa.float32()), nullable=False),
])

# page_texts/ (stage 3's extraction pass, `lait.filters.extract_stage.ExtractStage`): each page parsed
# once, its images with their texts, partitioned by page URL.
PAGE_TEXTS = pa.schema([
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("license", pa.string()),  # the page's, from pages/
    pa.field("found", pa.string(), nullable=False),  # the page's `PageTexts` as JSON (`page_texts_json`)
    pa.field("counted", pa.list_(pa.string()), nullable=False),  # `PageTexts.counted`, for the site count
])

# site_texts/ (stage 3's global count, `lait.filters.site_texts`): how many pages of a site offer
# each text, partitioned by site.
SITE_TEXTS = pa.schema([
    pa.field("site", pa.string(), nullable=False),
    pa.field("key", pa.int64(), nullable=False),  # `text_key` of the text
    pa.field("text", pa.string(), nullable=False),  # one spelling of it, for a reader
    pa.field("pages", pa.int32(), nullable=False),
    pa.field("site_pages", pa.int32(), nullable=False),
])

# doc_pages/ (stage 3's document pass, `lait.filters.documents`): each page's main text as
# paragraphs of sentences and the images of its main content in DOM order, partitioned by page URL.
DOC_IMAGE = pa.struct([
    pa.field("urls", pa.list_(pa.string()), nullable=False),  # the <img>'s URLs (src, srcset), best first
    pa.field("after", pa.int32(), nullable=False),  # how many of the paragraphs come before it
    pa.field("alt", pa.string()),
    # The licence the page declares for this image alone (a rel="license" link in its <figure>,
    # `lait.pagereader.figure_license`), as candidates.image_license holds it for the pairs.
    pa.field("license", pa.string()),
])
DOC_PAGES = pa.schema([
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("license", pa.string()),  # the page's, from pages/
    pa.field("lang", pa.string()),  # of the main text, as stage 3's language model reads it
    pa.field("title", pa.string()),
    pa.field("paragraphs", pa.list_(pa.list_(pa.string())), nullable=False),  # sentences per paragraph
    pa.field("images", pa.list_(DOC_IMAGE), nullable=False),
    pa.field("boilerplate", pa.int32(), nullable=False),  # sentences dropped as the site's boilerplate
])

# doc_sims/ (stage 4's document pass, `lait.scoring.documents`): for each document, the cosine of
# every image that has an embedding and every sentence, in the scorer of stage 4.
DOC_SIMS = pa.schema([
    pa.field("page_url", pa.string(), nullable=False),
    pa.field("image_urls", pa.list_(pa.string()), nullable=False),  # per image of the row: the URL scored, or null
    pa.field("n_sentences", pa.int32(), nullable=False),
    pa.field("sims", pa.binary(), nullable=False),  # float32, (images scored) x n_sentences, row-major
    pa.field("model", pa.string(), nullable=False),
    pa.field("pretrained", pa.string()),
])

TABLES: dict[str, Table] = {
    t.name: t
    for t in [
        Table("pages", PAGES, "url"),
        Table("images", IMAGES, "image_url"),
        Table("images_ok", IMAGES_OK, "image_url"),
        Table("candidates", CANDIDATES, "image_url"),
        Table("scored", SCORED, "image_url"),
        Table("rejected", REJECTED, "reason"),
        Table("warc_links", WARC_LINKS, "image_url"),
        Table("url_list", URL_LIST, "image_url"),
        Table("retry_queue", RETRY_QUEUE, "image_url"),
        Table("image_embs", IMAGE_EMBS, "image_url"),
        Table("text_embs", TEXT_EMBS, "image_url"),
        Table("regions", REGIONS, "image_url"),
        Table("region_labels", REGION_LABELS, "image_url"),
        Table("near_dups", NEAR_DUPS, "image_url_a"),
        Table("build_images", BUILD_IMAGES, "image_url"),
        Table("build_plan", BUILD_PLAN, "key"),
        Table("build_failed", BUILD_FAILED, "key"),
        Table("pool", POOL, "image_url"),
        Table("faces", FACES, "sha256"),
        Table("page_texts", PAGE_TEXTS, "page_url"),
        Table("site_texts", SITE_TEXTS, "site"),
        Table("doc_pages", DOC_PAGES, "page_url"),
        Table("doc_sims", DOC_SIMS, "page_url"),
    ]
}


def register_table(table: Table) -> Table:
    """Add a table that a stage owns (for example embeddings or region features)."""
    existing = TABLES.get(table.name)
    if existing is not None and not existing.schema.equals(table.schema):
        raise ValueError(f"table {table.name!r} is already registered with another schema")
    TABLES[table.name] = table
    return table


def get_table(name: str) -> Table:
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}") from None
