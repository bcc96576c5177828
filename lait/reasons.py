"""Why rows are dropped: every `stage/rule` reason of `rejected/`, and the status vocabulary.

Two vocabularies live here, one place each:

- **Drop reasons.** Every row any part of lait drops is kept in `rejected/` with a reason
  `stage/rule` (DESIGN.md). `REASONS` lists them all, each with one sentence saying what it
  means; `lait --help` of each command and the stats report read them from here. Writing a
  reason not listed here is an error (`check`), so a new rule fails its first test until it is
  registered with its sentence.
- **Fetch status.** The `error` column of `pages/` and `images/`, written by the crawl and by
  `ingest-warc` alike: None exactly when the body is stored, else one of `FETCH_ERRORS`
  (`http_error` makes the non-2xx ones). Stages 2 and 3 drop such a row for the rule
  `fetch_rule(error, table)` names (`filter/noai`, `clean/status`, ...).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

# -- drop reasons ------------------------------------------------------------------------------

REASONS: dict[str, str] = {
    # Stage 1, the crawl (`lait crawl`): requests that were never sent.
    "crawl/robots": "robots.txt of the host forbids the URL to lait's user agent; the request was "
                    "never sent.",
    "crawl/robots_unreachable": "the host's robots.txt could not be fetched (5xx, timeout, refused "
                                "connection, oversize cut); RFC 9309 says disallow all, so the "
                                "request was never sent.",
    "crawl/host_unreachable": "no connection to the host could be made when its robots.txt was asked "
                              "for (no such name, refused, no route); the request was never "
                              "sent.",
    "crawl/host_down": "the host failed several times in a row (DNS, refused connection, timeout) and "
                       "was marked down; this request to it was never sent.",
    "crawl/tdm_reserved": "the origin's /.well-known/tdmrep.json reserves text and data mining rights "
                          "for the path (W3C TDMRep); the request was never sent.",
    "crawl/decompression_bomb": "the response's body grew past the size limit while being decompressed "
                                "(gzip, deflate, brotli or zstd bomb; for robots.txt and "
                                "tdmrep.json, their 500 and 256 KiB); nothing stored, and a robots.txt "
                                "bomb disallows its whole host.",
    "crawl/redirect_loop": "a redirect points back at a URL of its own chain (a -> b -> a); nothing "
                           "stored.",
    "crawl/too_many_redirects": "more redirects than the limit (5): a redirect loop or a chain too long; "
                                "nothing stored.",
    "crawl/url_too_long": "the URL is longer than Scrapy's URLLENGTH_LIMIT (2,083 characters); never "
                          "requested.",
    "crawl/ignored": "dropped inside Scrapy for a reason lait has no rule of its own for (an "
                     "offsite redirect, say); the detail holds Scrapy's message.",
    "crawl/refused_loopback": "the host resolves to an address that reaches this machine (loopback, "
                              "0.0.0.0/8, ::, broadcast, this machine's own interfaces, or one of "
                              "these wrapped in IPv6); the request was never sent (allow with "
                              "--allow-loopback).",
    "crawl/refused_private": "the host resolves to a private or carrier-grade NAT address; the request "
                             "was never sent (allow with --allow-private).",
    "crawl/refused_link_local": "the host resolves to a link-local address; the request was never sent "
                                "(allow with --allow-private).",
    "crawl/refused_metadata": "the host resolves to a cloud instance metadata address; the request was "
                              "never sent.",
    "crawl/refused_reserved": "the host resolves to a multicast or reserved address; the request was "
                              "never sent (allow with --allow-private).",
    "crawl/excluded_domain": "the URL's host is, or is a subdomain of, a domain of --exclude-domains; "
                             "the request was never sent (nor its host's robots.txt).",
    "crawl/excluded_url": "the URL is, or lies below, an entry of --exclude-urls; the request was never "
                          "sent.",
    "crawl/too_deep": "the page nests elements deeper than libxml2 reads (256 levels): it was stored, "
                      "but the images and links below that depth were never seen, so not fetched.",
    # Stage 1 from archives (`lait ingest-warc`): records not stored, and damage notes.
    "ingest/noai_page": "a WAT record of a page whose X-Robots-Tag or robots meta tag says noai or "
                        "noimageai: its image links are not stored (a WARC page with noai is a pages/ "
                        "row with error noai).",
    "ingest/tdm_reserved_page": "a WAT record of a page that reserves text and data mining rights "
                                "(W3C TDMRep: a tdm-reservation: 1 header or meta tag): its image links "
                                "are not stored (a WARC page with it is a pages/ row with error "
                                "tdm_reserved).",
    "ingest/excluded_domain": "an archived record (page, image or WAT page) of a host on --exclude-domains "
                              "(or a subdomain of one); not stored.",
    "ingest/excluded_url": "an archived record of a URL on, or below an entry of, --exclude-urls; not stored.",
    "ingest/too_large": "a record larger than --max-record-mb, skipped unread.",
    "ingest/body_too_large": "a record whose payload is, or decodes to (a compression bomb), more than "
                             "the crawler's size limit for its kind (--max-page-bytes, "
                             "--max-image-bytes); decoding stopped there, nothing stored.",
    "ingest/bad_url": "a record whose target URI (WARC-Target-URI, or the page URL of a WAT record) "
                      "is not an http(s) URL with a host (javascript:, data:, file:, ...); not stored.",
    "ingest/bad_http": "a response record whose HTTP status line or headers cannot be parsed.",
    "ingest/content_encoding": "a response whose Content-Encoding is unsupported or cannot be undone "
                               "(damaged or mislabelled); not stored.",
    "ingest/too_deep": "the page nests elements deeper than libxml2 reads (256 levels): it was stored, "
                       "but the images below that depth were never seen, so not linked.",
    "ingest/bad_wat": "a WAT metadata record whose JSON cannot be read.",
    "ingest/not_warc": "the file is not a WARC or ARC archive, or not one record of it is readable.",
    "ingest/read_error": "the archive cannot be read past a record; the records before it were ingested.",
    "ingest/malformed_record": "a record with a missing or invalid WARC-Type or Content-Length; not stored.",
    "ingest/truncated_record": "a record shorter than its Content-Length; its partial payload is not stored.",
    "ingest/truncated_gzip": "the gzip stream ends early; the records before the cut were ingested.",
    "ingest/bad_gzip": "the gzip stream is corrupt; the records before the damage were ingested.",
    "ingest/gzip_members": "note: the gzip members do not match the records (not one member per "
                           "record); every record was still read.",
    "ingest/reader_warning": "note: warcio tolerated a problem of the archive (an invalid "
                             "Content-Length, say); the records were read.",
    "ingest/bad_target_uri": "note: WARC-Target-URIs with angle brackets or spaces were repaired "
                             "(recorded once per file); the records were read.",
    # Stage 1 from URL lists (`lait download`): list rows that name no image to fetch.
    "download/bad_url": "the row's URL is empty, not http(s), has no host or is longer than a request "
                        "may be (2083 characters); nothing was fetched.",
    "download/bad_page_url": "the row names a page URL that is not an http(s) URL with a host "
                             "(javascript:, data:, vbscript:, file:, ...), or whose host is an "
                             "address the crawler refuses (loopback, private, link-local, cloud "
                             "metadata, reserved; allowed by --allow-loopback and --allow-private "
                             "as for the fetch); the row is not kept, nothing was fetched.",
    "download/duplicate_url": "the row's URL is the URL of an earlier row (of this list or of one read "
                              "before into the work directory); the image is fetched once, for the "
                              "first row.",
    "download/bad_row": "a line of the list that cannot be read (not JSON, a wrong number of fields, "
                        "an unreadable CSV line), or a JSON line whose caption is not text (a list, "
                        "a number, NaN, an object); nothing was fetched.",
    # Stage 2 (`lait filter`): images/ -> images_ok/.
    "filter/noai": "the image was served with X-Robots-Tag noai or noimageai; its bytes were not stored.",
    "filter/status": "the image URL answered a status other than 200 (error http_N, or another 2xx).",
    "filter/tdm_reserved": "the image was served with a tdm-reservation: 1 header (W3C TDMRep); its "
                           "bytes were not stored.",
    "filter/not_image": "the image URL was served with a content type that is not an image; its "
                        "bytes were not stored.",
    "filter/download": "the image request got no response (DNS, connection, timeout or size limit).",
    "filter/empty": "the image body is empty (zero bytes).",
    "filter/too_large": "the image file is larger than max_bytes.",
    "filter/duplicate_sha256": "the same bytes as an image kept earlier in its partition.",
    "filter/excluded_hash": "the MD5 or SHA-256 of the image bytes, or the PDQ perceptual hash of the picture, "
                            "is on --exclude-hashes (a list of known images to keep out: abuse material, "
                            "privacy or rights complaints).",
    "filter/dmi_reserved": "the image file reserves data mining in its own metadata: XMP plus:DataMining "
                           "(IPTC Photo Metadata 2023.1) says prohibited for AI/ML training, generative "
                           "AI/ML training, or at all (also 'except search engine indexing' and 'see "
                           "constraint/rights expression'), or its C2PA training-mining assertion says "
                           "notAllowed or constrained for AI training, generative AI training or data mining.",
    "filter/svg": "an SVG (vector) image.",
    "filter/not_an_image": "the bytes are no raster image Pillow knows (often an HTML error page "
                           "served as an image).",
    "filter/decompression_bomb": "more pixels than max_pixels: a decompression bomb.",
    "filter/format": "an image format not in formats.",
    "filter/animated": "an animated image (animated: reject).",
    "filter/min_side": "the shorter side is below min_side pixels (LAIT: 300).",
    "filter/aspect_ratio": "the long side over the short side is above max_aspect.",
    "filter/truncated": "the image data ends early.",
    "filter/corrupt": "the image header or pixel data is invalid.",
    "filter/uninformative": "the uninformative-image classifier flagged it (flat: a logo, icon, chart "
                            "or blank with few colours).",
    "filter/unsafe": "the unsafe-image model (open_nsfw) gave it a probability above max_unsafe; "
                     "the detail has the probability.",
    "filter/duplicate_phash": "a perceptual (phash) duplicate of an image kept earlier in its partition.",
    "filter/error": "an unexpected error on this image (a codec bug); the partition went on.",
    # Stage 3 (`lait clean`): pages/ -> candidates/; whole pages first, then single texts.
    "clean/tdm_reserved": "the page reserved text and data mining rights (tdm-reservation header or "
                          "meta, W3C TDMRep); its HTML was not stored.",
    "clean/noai": "the page opted out (X-Robots-Tag or robots meta noai/noimageai); its HTML was not stored.",
    "clean/status": "the page answered a status other than 200 (error http_N, or another 2xx).",
    "clean/not_html": "the page is not HTML (its content type, or binary content).",
    "clean/download": "the page request got no response (DNS, connection, timeout or size limit).",
    "clean/empty": "the page body is empty.",
    "clean/unparsable": "lxml cannot parse the page.",
    "clean/too_deep": "the page nests elements deeper than libxml2 reads (256 levels).",
    "clean/timeout": "the page took longer than page_timeout seconds.",
    "clean/error": "an unexpected error on this page; the partition went on.",
    "clean/filename": "the text is or holds an image file name (IMG_1234, photo.jpg).",
    "clean/url": "the text holds a URL or a domain name.",
    "clean/boilerplate": "the text says nothing about a picture (image, logo, click to enlarge, ...).",
    "clean/word_count": "the text has fewer than min_words or, as a sentence, more than max_words words.",
    "clean/letters": "less than min_letter_share of the text's non-space characters are letters.",
    "clean/repetition": "the text repeats a character or words over and over.",
    "clean/credit": "a credit, byline or licence attribution standing alone (Photo: Reuters, By Jane "
                    "Doe, [CC BY 2.0] via Wikimedia Commons).",
    "clean/social": "a share, follow or like button, or a social network's name (Share on Facebook).",
    "clean/promo": "cookie, newsletter, subscription, advertising or legal text (Sign up for our newsletter).",
    "clean/navigation": "navigation or interface text (Read more, See also, You may also like, [edit]).",
    "clean/contact": "a postal address, phone number, e-mail address or contact line.",
    "clean/date": "a date or timestamp standing alone, or a teaser ending in one (... 2 hours ago).",
    "clean/markup": "markup (TeX, HTML tags) or lorem-ipsum placeholder text.",
    "clean/page_text": "a text the page gives several of its images (its og description, a headline "
                       "used as every alt, a paragraph between images): kept for the image it belongs "
                       "to, dropped for the others.",
    "clean/image_place": "a text of an image in the site's chrome (a logo, avatar, icon or social button, a "
                         "header, footer or menu picture), or of a teaser or side box when it repeats a link "
                         "of the page or is a sentence near it (lait.filters.image_place).",
    "clean/cut": "the text ends in an ellipsis: the site cut it short, and its page does not hold the whole "
                 "sentence to mend it from.",
    "clean/language": "the text is not in one of the configured languages.",
    "clean/site_boilerplate": "the text is offered to images on many pages of its site, counted over "
                              "every page of the work directory (site_repeat_min_pages, site_repeat_share).",
    "clean/not_caption": "the learned caption judge (lait.filters.caption_judge) reads the text, which "
                         "every rule kept, as junk no caption could use; the detail holds its "
                         "probability of junk and the threshold (caption_judge_threshold).",
    "clean/no_text": "a (page, image) pair with no candidate text left after cleaning.",
    # Stage 4 (`lait score`).
    "score/decode_error": "the image bytes do not decode for the model; each of its texts is dropped.",
    # Stage 5 (`lait build`).
    "build/no_image": "scored texts of an image URL that has no images_ok/ row.",
    "build/duplicate_sha256": "the same bytes as the image its group keeps (a copy under another URL).",
    "build/duplicate_phash": "a perceptual hash within phash_threshold bits of the image its group keeps, "
                             "and pixels that agree (near_dup_max_diff).",
    "build/near_duplicate": "stage 4's embeddings put it next to the image its group keeps, its "
                            "perceptual hash agrees (within near_dup_max_phash bits) and so do its "
                            "pixels (near_dup_max_diff).",
    "build/eval_overlap": "the picture is one of the --exclude-eval evaluation set's, or a copy of one (resized, "
                          "re-encoded or cropped: perceptual hash within eval_max_phash bits and pixels within "
                          "eval_max_diff), or a duplicate of such a copy; kept out so retrieval scores stay honest.",
    "build/too_many_texts": "the picture carries more than max_texts_per_image distinct texts.",
    "build/too_many_pages": "the picture is on more than max_pages_per_image pages (a logo, site chrome).",
    "build/generic_texts": "every text of the picture is on more than max_images_per_text pictures.",
    "build/min_score": "the best text's score is below min_score.",
    "build/top_fraction": "the best text's score is not within the top_fraction of the pictures.",
    "build/unreadable": "the image bytes cannot be read, resized or encoded for its shard (its sidecar row "
                        "says failed_to_download or failed_to_resize).",
    "build/corrupt_image": "the image bytes read back from images_ok/ do not have the SHA-256 stage 2 recorded "
                           "(a flipped or lost byte on disk): never shipped; `lait verify` names the part.",
    # `lait documents` (lait.filters.documents, lait.build.documents): pages left out of the
    # interleaved documents; the pairs are not affected.
    "documents/error": "the document pass failed on the page (the detail says how); the run went on.",
    "documents/no_text": "trafilatura finds no main text on the page.",
    "documents/language": "the page's main text is not in one of the configured languages.",
    "documents/too_few_words": "the document has fewer words than min_words once its boilerplate is out.",
    "documents/repeated_paragraphs": "more than max_repeated_share of its paragraphs repeat another of them.",
    "documents/no_image": "no picture of the main text is left: none stage 2 kept, or none with a sentence "
                          "scoring at least min_sim.",
    "documents/too_many_images": "more pictures than one per min_words_per_image words of text.",
    "documents/near_duplicate": "its text's word shingles overlap those of a document kept before it by at "
                                "least max_overlap (MinHash estimate).",
    "documents/image_unreadable": "a picture of the document could not be read or encoded; it leaves the "
                                  "document, which goes on without it.",
    # `lait select --recipe` (lait.build.curate): pool samples a recipe's step left out.
    "select/language": "the caption's language (stage 3's fastText lid.176) is not one the recipe keeps.",
    "select/caption_words": "the caption has no more whitespace-separated words than the recipe asks for.",
    "select/caption_chars": "the caption has no more characters than the recipe asks for.",
    "select/min_side": "the image's shorter side is below the recipe's minimum.",
    "select/aspect": "the image's longer side over its shorter is above the recipe's maximum.",
    "select/min_score": "the best text's score is below the recipe's threshold.",
    "select/top_fraction": "the best text's score is not within the recipe's top fraction.",
    "select/random_fraction": "not drawn into the recipe's random fraction (a seeded hash of the uid).",
    "select/no_entity": "the caption names no entry of the recipe's list of names (ImageNet classes).",
    "select/metaclip_unmatched": "the caption matches no entry of the MetaCLIP metadata.",
    "select/metaclip_balance": "in MetaCLIP balancing, none of the caption's metadata entries drew it within "
                               "their t pairs.",
    "select/semdedup": "the cosine of its image embedding to a better-scoring picture kept in its "
                       "k-means cluster exceeds 1 - eps (SemDeDup).",
    "select/image_cluster": "its image embedding's k-means cluster is not the nearest cluster of any target "
                            "image (DataComp's image-based filter).",
    "select/no_embedding": "the picture has no image embedding in image_embs/, which SemDeDup needs.",
}


def check(reason: str) -> str:
    """`reason` itself when it is registered; ValueError otherwise."""
    if reason not in REASONS:
        raise ValueError(f"unregistered drop reason {reason!r}: add it to lait/reasons.py "
                         "with one sentence saying what it means")
    return reason


def register(reason: str, meaning: str) -> None:
    """Add a reason of a stage that lives outside lait (a plugin, a test's toy stage)."""
    stage, _, rule = reason.partition("/")
    if not stage or not rule or not meaning:
        raise ValueError(f"a reason is 'stage/rule' with a meaning, got {reason!r}")
    if REASONS.get(reason, meaning) != meaning:
        raise ValueError(f"{reason!r} is registered with another meaning")
    REASONS[reason] = meaning


def reasons_of(stage: str) -> dict[str, str]:
    """The reasons of one stage (`filter`, `clean`, ...), in registry order."""
    return {r: m for r, m in REASONS.items() if r.startswith(stage + "/")}


def describe(meanings: dict[str, str], width: int = 96, indent: int = 2) -> str:
    """`name  meaning` lines, the meanings wrapped in a column, for a command's --help."""
    col = indent + max(map(len, meanings)) + 2
    lines = []
    for name, meaning in meanings.items():
        wrapped = textwrap.wrap(meaning, max(30, width - col), break_on_hyphens=False)
        lines.append(" " * indent + name.ljust(col - indent) + wrapped[0])
        lines += [" " * col + more for more in wrapped[1:]]
    return "\n".join(lines)


def reasons_help(stages: Iterable[str]) -> str:
    """The `--help` section listing the reasons a command writes into `rejected/`."""
    meanings = {r: m for s in stages for r, m in reasons_of(s).items()}
    return "rows it drops go to WORK/rejected/ with one of these reasons:\n" + describe(meanings)


# -- the status vocabulary of pages/ and images/ -------------------------------------------

FETCH_ERRORS: dict[str, str] = {
    "http_<N>": "the response had the non-2xx status N (the status column holds N); nothing stored.",
    "noai": "X-Robots-Tag or robots meta says noai/noimageai; the row is kept, the body not stored.",
    "tdm_reserved": "a tdm-reservation: 1 header or meta tag (W3C TDMRep); the row is kept, the body "
                    "not stored.",
    "not_html": "pages/: the response is not HTML by its content type; nothing stored.",
    "not_image": "images/: the response is not an image by its content type; nothing stored.",
    "empty": "images/: a 2xx response with an empty body.",
    "download/<Error>": "no response at all (status 0); <Error> is the exception's class name.",
}

# The rules stages 2 and 3 drop a row of each table for (see `fetch_rule`): a non-2xx status
# is `status`, no response is `download`, the other errors name themselves.
FETCH_RULES: dict[str, frozenset[str]] = {
    "pages": frozenset({"status", "download", "noai", "tdm_reserved", "not_html"}),
    "images": frozenset({"status", "download", "noai", "tdm_reserved", "not_image", "empty"}),
}


def http_error(status: int) -> str | None:
    """The `error` of a response with this status: None for 2xx, else `http_N`."""
    return None if 200 <= status < 300 else f"http_{status}"


def fetch_rule(error: str | None, table: str) -> str | None:
    """The rule a row of `table` (`pages` or `images`) is dropped for by its `error`; None when
    no error is set. The stage prefixes it: an image served with noai is `filter/noai`, a 404
    page `clean/status`. ValueError for an error outside the vocabulary."""
    if error is None:
        return None
    # status_N and "http N": what the crawl and the ingest wrote before the vocabulary was one.
    if error.startswith(("http_", "status_", "http ")):
        rule = "status"
    elif error.startswith("download/"):
        rule = "download"
    else:
        rule = error
    if rule not in FETCH_RULES[table]:
        raise ValueError(f"unknown error {error!r} in {table}/; the vocabulary is in lait/reasons.py")
    return rule


def fetch_errors_help() -> str:
    """The `--help` section on the `error` column of pages/ and images/."""
    return "the error column of pages/ and images/ (None when the body is stored):\n" + describe(FETCH_ERRORS)
