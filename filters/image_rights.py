"""The licence an image file declares for itself (issue 33), read by stage 2 where it opens the bytes.

A photo carries its own rights in its metadata, whatever page shows it: the XMP packet's
`cc:license` (Creative Commons' schema), `xmpRights:WebStatement` (a URL stating the rights) or
`dc:rights` (a rights statement), else the IPTC IIM Copyright Notice (record 2, dataset 116).
The first of these that the file has, in that order (a licence URL before a free text), is the
image's `rights` in `images_ok/` and reaches the sample's JSON as its `image_license` (from
`file`), apart from the licence of the page the image was found on.
"""

from __future__ import annotations

from typing import Any

from lait.filters.consent import xmp_packets

RDF = "http://www.w3.org/1999/02/22-rdf-syntax-ns#"
# (namespace, local name) in the order they are preferred.
XMP_RIGHTS = (("http://creativecommons.org/ns#", "license"),
              ("http://ns.adobe.com/xap/1.0/rights/", "WebStatement"),
              ("http://purl.org/dc/elements/1.1/", "rights"))
IPTC_COPYRIGHT = (2, 116)
MAX_CHARS = 500  # a rights statement longer than this is cut: it is a field, not a document


def _xmp_values(packet: bytes) -> dict[str, str]:
    """The first value of each of `XMP_RIGHTS` in one packet, by local name: an element's text,
    its rdf:resource, the first rdf:li of a list (dc:rights is an rdf:Alt), or an attribute."""
    from lxml import etree

    parser = etree.XMLParser(resolve_entities=False, no_network=True, recover=True, huge_tree=False)
    try:
        root = etree.fromstring(packet, parser)
    except (etree.XMLSyntaxError, ValueError):
        return {}
    if root is None:
        return {}
    tags = {f"{{{ns}}}{name}": name for ns, name in XMP_RIGHTS}
    found: dict[str, str] = {}
    for el in root.iter():
        if not isinstance(el.tag, str):
            continue
        for tag, name in tags.items():
            value = el.get(tag)
            if value and value.strip():
                found.setdefault(name, value.strip())
        name = tags.get(el.tag)
        if name is None or name in found:
            continue
        li = next(el.iter(f"{{{RDF}}}li"), None)
        value = (el.get(f"{{{RDF}}}resource") or (li.get(f"{{{RDF}}}resource") or li.text if li is not None else None)
                 or el.text or "")
        if value.strip():
            found[name] = value.strip()
    return found


def _iptc_copyright(image: Any) -> str | None:
    from PIL import IptcImagePlugin

    try:
        info = IptcImagePlugin.getiptcinfo(image) or {}
    except Exception:  # a malformed IPTC block says nothing we can read; the image is not rejected for it
        return None
    value = info.get(IPTC_COPYRIGHT)
    if isinstance(value, list):
        value = value[0] if value else None
    if not isinstance(value, bytes):
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = value.decode("latin-1")
    return " ".join(text.split()) or None


def file_rights(image: Any, data: bytes | memoryview, image_format: str | None) -> str | None:
    """The rights an image file declares (see the module docstring), or None. `image` is the
    opened Pillow image (its header read), `data` the file's bytes."""
    for packet in xmp_packets(image.info, data, image_format):
        values = _xmp_values(packet)
        for _, name in XMP_RIGHTS:
            if name in values:
                return " ".join(values[name].split())[:MAX_CHARS]
    if image_format in ("JPEG", "MPO", "TIFF"):
        text = _iptc_copyright(image)
        if text:
            return text[:MAX_CHARS]
    return None
