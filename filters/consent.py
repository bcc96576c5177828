"""Stage 2's consent checks on the image file itself: hash block lists, reservations inside it.

- **Hash lists** (`--exclude-hashes FILE`): hex digests of image bytes to keep out, one a
  line, as the lists of known abuse material and of privacy or rights complaints are shared.
  A 32-digit entry is an MD5, a 64-digit one a SHA-256; ``md5:`` / ``sha256:`` prefixes are
  accepted, ``#`` starts a comment. ``pdq:HEX`` entries are PDQ perceptual hashes (Meta's,
  as ThreatExchange shares them: 64 hex digits, word 15 first), matched within
  `PDQ_MAX_DISTANCE` bits, so a resized or re-encoded copy is caught too; they need the
  `pdqhash` package (the `pdq` extra; it builds from source). An image whose bytes or picture
  match is `filter/excluded_hash`.
- **Reservations in the file** (IPTC Photo Metadata 2023.1, `plus:DataMining`, from the PLUS
  Coalition's vocabulary): the XMP packet (JPEG APP1, PNG iTXt, WebP XMP chunk, TIFF tag
  700) may say data mining is prohibited. lait builds training data, so every value that
  prohibits AI/ML training, generative AI/ML training, or data mining in general reserves the
  image (`filter/dmi_reserved`); "unspecified" and "allowed" do not. The ``SEE...`` values
  prohibit and point to a constraint lait cannot evaluate: reserved too. An unknown value
  that says ``PROHIBITED`` is taken as a prohibition.
- **C2PA training and mining assertions** (`c2pa.training-mining`, and the CAWG's
  `cawg.training-mining` that replaces it in C2PA 2.x), read with the C2PA project's own reader,
  `c2pa-python` (the `consent` extra), when the bytes carry a manifest (a JUMBF ``c2pa`` box).
  An entry for AI training, generative AI training or data mining whose ``use`` is
  ``notAllowed`` reserves the image; so does ``constrained``, whose constraint lait cannot
  evaluate. The assertion is honoured whether or not the signer is trusted: a reservation
  costs the dataset one image, ignoring a real one costs the owner their say. Without the
  package, an image with a manifest is kept and a warning says once that manifests went unread.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lait.config import ConfigError

log = logging.getLogger(__name__)

PLUS_NS = "http://ns.useplus.org/ldf/xmp/1.0/"
VOCAB = "http://ns.useplus.org/ldf/vocab/"

# Each PLUS Data Mining value, with its label (what ExifTool writes when given the label) and
# whether it reserves the image against use in a training set.
DMI_VALUES: dict[str, tuple[str, bool]] = {
    "DMI-UNSPECIFIED": ("Unspecified - no prohibition defined", False),
    "DMI-ALLOWED": ("Allowed", False),
    "DMI-PROHIBITED-AIMLTRAINING": ("Prohibited for AI/ML training", True),
    "DMI-PROHIBITED-GENAIMLTRAINING": ("Prohibited for Generative AI/ML training", True),
    "DMI-PROHIBITED-EXCEPTSEARCHENGINEINDEXING": ("Prohibited except for search engine indexing", True),
    "DMI-PROHIBITED": ("Prohibited", True),
    "DMI-PROHIBITED-SEECONSTRAINT": ("Prohibited, see plus:OtherConstraints", True),
    "DMI-PROHIBITED-SEEEMBEDDEDRIGHTSEXPR": ("Prohibited, see iptcExt:EmbdEncRightsExpr", True),
    "DMI-PROHIBITED-SEELINKEDRIGHTSEXPR": ("Prohibited, see iptcExt:LinkedEncRightsExpr", True),
}
_BY_LABEL = {re.sub(r"\W+", " ", label).strip().lower(): code for code, (label, _) in DMI_VALUES.items()}


# -- hash lists ------------------------------------------------------------------------------------

# ThreatExchange's match threshold for PDQ: at most 31 of 256 bits differ. Hashes of quality
# below 50 (flat, featureless pictures) are unreliable and are not compared.
PDQ_MAX_DISTANCE = 31
PDQ_MIN_QUALITY = 50
PDQ_SIDE = 512  # the reference hasher's input: the picture scaled to fit 512 px


@dataclass(frozen=True)
class HashList:
    md5: frozenset[str] = frozenset()
    sha256: frozenset[str] = frozenset()
    pdq: Any = field(default=None, compare=False)  # (N, 32) uint8: the listed PDQ hashes' bytes

    def __bool__(self) -> bool:
        return bool(self.md5 or self.sha256) or self.pdq is not None

    def match_pdq(self, image: Any) -> str | None:
        """'pdq HEX (distance D)' when the picture's PDQ hash is within PDQ_MAX_DISTANCE bits of a
        listed one; None otherwise, or when the picture is too flat to hash reliably."""
        if self.pdq is None:
            return None
        mine, quality = pdq_hash(image)
        if quality < PDQ_MIN_QUALITY:
            return None
        dist = np.bitwise_count(self.pdq ^ mine).sum(axis=1, dtype=np.int32)
        best = int(np.argmin(dist))
        if dist[best] > PDQ_MAX_DISTANCE:
            return None
        return f"pdq {self.pdq[best].tobytes().hex()} (distance {int(dist[best])})"

    def match(self, data: bytes | memoryview, sha256: str) -> str | None:
        """'md5 HEX' or 'sha256 HEX' when the bytes are listed, else None. `sha256`: the hex
        digest stage 2 already took; MD5 is taken only when the list has MD5 entries."""
        if sha256 in self.sha256:
            return f"sha256 {sha256}"
        if self.md5:
            md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
            if md5 in self.md5:
                return f"md5 {md5}"
        return None


def pdq_hash(image: Any) -> tuple[np.ndarray, int]:
    """(32 bytes, quality) of an RGB PIL image's PDQ hash, bytes in ThreatExchange's hex order."""
    import pdqhash
    from PIL import Image

    if max(image.size) > PDQ_SIDE:
        image = image.copy()
        image.thumbnail((PDQ_SIDE, PDQ_SIDE), Image.Resampling.BILINEAR)
    bits, quality = pdqhash.compute(np.ascontiguousarray(np.asarray(image.convert("RGB"), np.uint8)))
    # pdqhash gives bit 255 first, as hashtool256 prints them; packed, that is word 15 first.
    return np.packbits(np.asarray(bits, np.uint8)), int(quality)


_HEX = re.compile(r"[0-9a-f]+")


def load_hash_list(path: str) -> HashList:
    """The digests in `path`; ConfigError for a line that is not one."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ConfigError(f"exclude_hashes: {path} cannot be read: {exc.strerror or exc}") from None
    md5: set[str] = set()
    sha: set[str] = set()
    pdq: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip().lower()
        if not entry:
            continue
        kind, _, digest = entry.rpartition(":")
        digest = digest.strip()
        if kind.strip() == "pdq":
            if not (_HEX.fullmatch(digest) and len(digest) == 64):
                raise ConfigError(f"exclude_hashes: {path}:{n}: not a PDQ hash (64 hex digits): {line.strip()[:80]!r}")
            pdq.add(digest)
            continue
        if not _HEX.fullmatch(digest) or kind not in ("", "md5", "sha256") or len(digest) not in (32, 64) \
                or (kind == "md5" and len(digest) != 32) or (kind == "sha256" and len(digest) != 64):
            raise ConfigError(f"exclude_hashes: {path}:{n}: not an MD5 or SHA-256 hex digest: {line.strip()[:80]!r}")
        (md5 if len(digest) == 32 else sha).add(digest)
    if pdq:
        try:
            import pdqhash  # noqa: F401
        except ImportError:
            raise ConfigError(f"exclude_hashes: {path} has PDQ entries, but the pdqhash package is not "
                              "installed (pip install 'lait[pdq]'; it needs a C++ compiler)") from None
    table = np.frombuffer(bytes.fromhex("".join(sorted(pdq))), np.uint8).reshape(-1, 32) if pdq else None
    return HashList(frozenset(md5), frozenset(sha), table)


# -- plus:DataMining -------------------------------------------------------------------------------

_XMP_KEYS = ("xmp", "XML:com.adobe.xmp")  # Pillow's keys: JPEG/WebP/TIFF, and PNG's iTXt
_PACKET = re.compile(rb"<x:xmpmeta\b.*?</x:xmpmeta>", re.S)
_PLUS_NS_BYTES = PLUS_NS.encode()
_PLUS_NS_RE = re.compile(re.escape(_PLUS_NS_BYTES))  # re searches a memoryview without copying it


# Formats whose XMP Pillow reads from the header in full: JPEG's APP1, WebP's XMP chunk. Other
# files (a PNG's iTXt after the image data, a TIFF in some layouts) are searched byte by byte.
_XMP_IN_HEADER = frozenset({"JPEG", "MPO", "WEBP"})


def xmp_packets(info: dict, data: bytes | memoryview, image_format: str | None = None) -> list[bytes]:
    """The XMP packets of an image: what Pillow read from the header, and, for formats where
    Pillow may miss one, the packets in the raw bytes when these name the PLUS namespace."""
    out = []
    for key in _XMP_KEYS:
        value = info.get(key)
        if isinstance(value, str):
            value = value.encode("utf-8", "replace")
        if isinstance(value, (bytes, bytearray)) and value:
            out.append(bytes(value))
    if image_format in _XMP_IN_HEADER or any(_PLUS_NS_BYTES in p for p in out):
        return out
    if _PLUS_NS_RE.search(data):
        out += _PACKET.findall(data)
    return out


def data_mining_values(packet: bytes) -> list[str]:
    """The plus:DataMining values of one XMP packet, as written (URI, code or label): as an
    element's text, an rdf:resource, an attribute of rdf:Description, or items of a list."""
    from lxml import etree

    if _PLUS_NS_BYTES not in packet:
        return []
    parser = etree.XMLParser(resolve_entities=False, no_network=True, recover=True, huge_tree=False)
    try:
        root = etree.fromstring(packet, parser)
    except (etree.XMLSyntaxError, ValueError):
        root = None
    if root is None:  # not XML enough to parse: look for the vocabulary's codes themselves
        return [m.decode() for m in re.findall(rb"DMI-[A-Z-]+", packet)]
    values = []
    tag = f"{{{PLUS_NS}}}DataMining"
    rdf = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
    for el in root.iter():
        if not isinstance(el.tag, str):
            continue
        if tag in el.attrib:
            values.append(el.attrib[tag])
        if el.tag == tag:
            resource = el.get(f"{{{rdf}}}resource")
            if resource:
                values.append(resource)
            items = [li for li in el.iter(f"{{{rdf}}}li")]
            values += [(li.get(f"{{{rdf}}}resource") or li.text or "") for li in items]
            if not items and (el.text or "").strip():
                values.append(el.text)
    return [v.strip() for v in values if v and v.strip()]


def dmi_code(value: str) -> str:
    """The vocabulary code a written value means (URI, bare code or label); the value itself,
    upper-cased, when it is none of them."""
    v = value.strip()
    if v.startswith(VOCAB):
        v = v[len(VOCAB):]
    elif "/" in v and "DMI-" in v.upper():
        v = v.rsplit("/", 1)[1]
    if v.upper() in DMI_VALUES:
        return v.upper()
    return _BY_LABEL.get(re.sub(r"\W+", " ", v).strip().lower(), v.upper())


def dmi_reservation(info: dict, data: bytes | memoryview, image_format: str | None = None) -> str | None:
    """The reserving value of an image's plus:DataMining (for the reject's detail), or None."""
    for packet in xmp_packets(info, data, image_format):
        for value in data_mining_values(packet):
            code = dmi_code(value)
            reserved = DMI_VALUES[code][1] if code in DMI_VALUES else "PROHIBITED" in code
            if reserved:
                return f"plus:DataMining {code}"
    return None


# -- C2PA ------------------------------------------------------------------------------------------

C2PA_LABELS = ("c2pa.training-mining", "cawg.training-mining")
C2PA_ENTRIES = frozenset(f"{ns}.{use}" for ns in ("c2pa", "cawg")
                         for use in ("ai_training", "ai_generative_training", "data_mining"))
C2PA_RESERVING = frozenset({"notAllowed", "constrained"})
_JUMBF = re.compile(rb"jumb.{0,64}?c2pa", re.S)  # a JUMBF superbox labelled c2pa: the manifest store
_C2PA_MIMES = {"JPEG": "image/jpeg", "MPO": "image/jpeg", "PNG": "image/png", "WEBP": "image/webp",
               "TIFF": "image/tiff", "GIF": "image/gif"}
_warned = False


def has_c2pa_manifest(data: bytes | memoryview, applist: list | None = None) -> bool:
    """Whether the bytes hold a C2PA manifest store; for a JPEG, whose store is in APP11
    segments, Pillow's list of APP segments (`applist`) answers without a scan of the bytes."""
    if applist is not None:
        return any(marker == "APP11" and _JUMBF.search(body) for marker, body in applist)
    return _JUMBF.search(data) is not None


def c2pa_uses(manifest_store: dict) -> list[tuple[str, str, str]]:
    """(assertion label, entry, use) of every training and mining entry of every manifest."""
    out = []
    for manifest in (manifest_store.get("manifests") or {}).values():
        for assertion in manifest.get("assertions") or []:
            label = str(assertion.get("label", ""))
            if label.split(".v", 1)[0] not in C2PA_LABELS:  # labels may carry a version: .v2
                continue
            entries = (assertion.get("data") or {}).get("entries") or {}
            for entry, value in entries.items():
                if entry in C2PA_ENTRIES and isinstance(value, dict):
                    out.append((label, entry, str(value.get("use", ""))))
    return out


def c2pa_reservation(data: bytes | memoryview, image_format: str, applist: list | None = None) -> str | None:
    """The reserving entry of an image's C2PA training-mining assertion, or None."""
    global _warned
    mime = _C2PA_MIMES.get(image_format)
    if mime is None or not has_c2pa_manifest(data, applist):
        return None
    try:
        import c2pa
    except ImportError:
        if not _warned:
            _warned = True
            log.warning("an image carries a C2PA manifest, but c2pa-python is not installed: C2PA "
                        "training-mining assertions go unread (pip install 'lait[consent]')")
        return None
    try:
        with c2pa.Reader(mime, io.BytesIO(bytes(data))) as reader:
            store = json.loads(reader.json())
    except (c2pa.C2paError, ValueError, OSError) as exc:
        log.debug("C2PA manifest unreadable: %s", exc)
        return None
    for label, entry, use in c2pa_uses(store):
        if use in C2PA_RESERVING:
            return f"C2PA {label}: {entry} {use}"
    return None
