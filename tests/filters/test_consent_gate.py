"""Issue 32 items 3 and 4 at stage 2: hash block lists, and reservations inside the image file
(IPTC Photo Metadata 2023.1 `plus:DataMining`)."""

from __future__ import annotations

import hashlib
import io

import pytest
from PIL import Image, PngImagePlugin, TiffImagePlugin

from lait.config import ConfigError
from lait.executor import LocalExecutor
from lait.filters.config import FilterConfig
from lait.filters.consent import DMI_VALUES, VOCAB, dmi_code, load_hash_list
from lait.filters.image_stage import ImageFilterStage
from lait.workdir import WorkDir


def run_filter(work: WorkDir, **settings) -> None:
    cfg = FilterConfig(work=str(work.root), workers=1, progress=False, **settings)
    cfg.validate()
    report = LocalExecutor(workers=1, retries=0, show_progress=False).run(ImageFilterStage(cfg), work)
    assert report.ok, report.summary()


def outcome(work: WorkDir) -> tuple[set[str], dict[str, tuple[str, str]]]:
    kept = {r["image_url"] for r in work.iter_rows("images_ok")}
    rejected = {r["image_url"]: (r["reason"], r["detail"]) for r in work.iter_rows("rejected")}
    return kept, rejected


# -- plus:DataMining -------------------------------------------------------------------------------

def xmp(value: str, form: str) -> bytes:
    """An XMP packet whose plus:DataMining is `value`, written as an element, an attribute of
    rdf:Description or an rdf:resource (the three ways XMP writers put a simple property)."""
    ns = 'xmlns:plus="http://ns.useplus.org/ldf/xmp/1.0/"'
    if form == "element":
        desc = f'<rdf:Description rdf:about="" {ns}><plus:DataMining>{value}</plus:DataMining></rdf:Description>'
    elif form == "attribute":
        desc = f'<rdf:Description rdf:about="" {ns} plus:DataMining="{value}"/>'
    else:
        desc = f'<rdf:Description rdf:about="" {ns}><plus:DataMining rdf:resource="{value}"/></rdf:Description>'
    return ('<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>'
            '<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
            f'{desc}</rdf:RDF></x:xmpmeta><?xpacket end="w"?>').encode()


def with_xmp(img: Image.Image, fmt: str, packet: bytes, td) -> bytes:
    if fmt == "PNG":  # iTXt, compressed: Pillow must inflate it
        info = PngImagePlugin.PngInfo()
        info.add_itxt("XML:com.adobe.xmp", packet.decode(), zip=True)
        return td.encode(img, "PNG", pnginfo=info)
    if fmt == "TIFF":  # tag 700
        ifd = TiffImagePlugin.ImageFileDirectory_v2()
        ifd[700] = packet
        ifd.tagtype[700] = 1
        return td.encode(img, "TIFF", tiffinfo=ifd)
    return td.encode(img, fmt, xmp=packet)  # JPEG APP1, WebP XMP chunk


# Each value once as its URI, its bare code and its label (as ExifTool writes it from the label),
# in each container format the stage reads.
SPELLINGS = [("uri", "JPEG", "element"), ("code", "PNG", "attribute"), ("label", "WEBP", "element"),
             ("uri", "TIFF", "resource")]


def _spelled(code: str, how: str) -> str:
    return {"uri": VOCAB + code, "code": code, "label": DMI_VALUES[code][0]}[how]


def test_vocabulary_is_the_iptc_one():
    assert len(DMI_VALUES) == 9  # IPTC Photo Metadata 2023.1 / PLUS LDF Data Mining vocabulary
    allowed = {c for c, (_, reserved) in DMI_VALUES.items() if not reserved}
    assert allowed == {"DMI-UNSPECIFIED", "DMI-ALLOWED"}
    assert dmi_code("Unspecified – no prohibition defined") == "DMI-UNSPECIFIED"  # en dash, as IPTC prints it
    assert dmi_code(" http://ns.useplus.org/ldf/vocab/DMI-PROHIBITED ") == "DMI-PROHIBITED"


def test_every_data_mining_value_reserved_ones_rejected_others_kept(make_work, td):
    work = make_work(n_partitions=2)
    rows, expect_reserved, expect_kept = [], {}, set()
    for i, code in enumerate(DMI_VALUES):
        for j, (how, fmt, form) in enumerate(SPELLINGS):
            url = f"http://site.test/{code}/{how}.{fmt.lower()}"
            data = with_xmp(td.photo(10 * i + j, 420, 340), fmt, xmp(_spelled(code, how), form), td)
            rows.append(td.image_row(url, data, mime=f"image/{fmt.lower()}"))
            if DMI_VALUES[code][1]:
                expect_reserved[url] = code
            else:
                expect_kept.add(url)
    # No XMP at all, and XMP without a DataMining property: kept.
    rows.append(td.image_row("http://site.test/plain.jpg", td.encode(td.photo(99, 420, 340))))
    other = xmp("x", "element").replace(b"plus:DataMining", b"plus:ImageSupplierName")
    rows.append(td.image_row("http://site.test/other-xmp.jpg", with_xmp(td.photo(98, 420, 340), "JPEG", other, td)))
    expect_kept |= {"http://site.test/plain.jpg", "http://site.test/other-xmp.jpg"}
    td.write_table(work, "images", rows, "image_url")

    run_filter(work)
    kept, rejected = outcome(work)
    assert kept == expect_kept
    assert set(rejected) == set(expect_reserved)
    for url, code in expect_reserved.items():
        assert rejected[url] == ("filter/dmi_reserved", f"plus:DataMining {code}"), url
    assert len(expect_reserved) == 7 * len(SPELLINGS)


def _png_with_trailing_xmp(png: bytes, packet: bytes) -> bytes:
    """A PNG whose XMP iTXt chunk comes after the image data, where Pillow's header read does not
    look (writers may put it there)."""
    import struct
    import zlib

    body = b"iTXt" + b"XML:com.adobe.xmp\x00" + b"\x00\x00" + b"\x00" + b"\x00" + packet
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)
    end = png.rindex(b"IEND") - 4
    return png[:end] + chunk + png[end:]


def test_xmp_after_the_image_data_is_found(make_work, td):
    work = make_work()
    packet = xmp(VOCAB + "DMI-PROHIBITED", "element")
    data = _png_with_trailing_xmp(td.encode(td.photo(3, 420, 340), "PNG"), packet)
    assert "xmp" not in Image.open(io.BytesIO(data)).info  # Pillow's header read misses it
    td.write_table(work, "images", [td.image_row("http://site.test/late.png", data, mime="image/png")], "image_url")
    run_filter(work)
    assert outcome(work)[1]["http://site.test/late.png"] == ("filter/dmi_reserved", "plus:DataMining DMI-PROHIBITED")


def test_data_mining_off_keeps_reserved_images(make_work, td):
    work = make_work()
    data = with_xmp(td.photo(1, 420, 340), "JPEG", xmp(VOCAB + "DMI-PROHIBITED-AIMLTRAINING", "element"), td)
    td.write_table(work, "images", [td.image_row("http://site.test/r.jpg", data)], "image_url")
    run_filter(work, obey_reservations=False)
    assert outcome(work)[0] == {"http://site.test/r.jpg"}


def test_damaged_xmp_still_reserves(make_work, td):
    """A packet that is not well-formed XML (a writer's bug, a cut) still says what it says."""
    work = make_work()
    packet = xmp(VOCAB + "DMI-PROHIBITED-GENAIMLTRAINING", "element").replace(b"</rdf:RDF>", b"<rdf:li <<")
    data = with_xmp(td.photo(2, 420, 340), "JPEG", packet, td)
    td.write_table(work, "images", [td.image_row("http://site.test/cut.jpg", data)], "image_url")
    run_filter(work)
    assert outcome(work)[1]["http://site.test/cut.jpg"][0] == "filter/dmi_reserved"


# -- hash lists ------------------------------------------------------------------------------------

def test_hash_list_on_real_photos(make_work, td, shared_data, tmp_path):
    photos = sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[:8]
    assert len(photos) == 8
    data = {f"http://photos.test/{p.name}": p.read_bytes() for p in photos}
    urls = list(data)
    listed = tmp_path / "hashes.txt"
    listed.write_text(
        "# known images to keep out\n"
        f"{hashlib.md5(data[urls[0]]).hexdigest()}\n"
        f"sha256:{hashlib.sha256(data[urls[1]]).hexdigest()}   # a complaint\n"
        f"\n{hashlib.md5(data[urls[2]]).hexdigest().upper()}\n"
        f"{hashlib.sha256(b'not one of these photos').hexdigest()}\n")
    work = make_work(n_partitions=2)
    td.write_table(work, "images", [td.image_row(u, d) for u, d in data.items()], "image_url")
    run_filter(work, exclude_hashes=str(listed))
    kept, rejected = outcome(work)
    assert kept == set(urls[3:])
    assert {u: r[0] for u, r in rejected.items()} == {u: "filter/excluded_hash" for u in urls[:3]}
    assert rejected[urls[0]][1].startswith("md5 ") and rejected[urls[1]][1].startswith("sha256 ")


def test_hash_list_errors_are_config_errors(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("d41d8cd98f00b204e9800998ecf8427e\nnot-a-digest\n")
    with pytest.raises(ConfigError, match=r"bad.txt:2"):
        load_hash_list(str(bad))
    with pytest.raises(ConfigError, match="cannot be read"):
        FilterConfig(work=str(tmp_path), exclude_hashes=str(tmp_path / "missing.txt")).validate()
    short = tmp_path / "short.txt"
    short.write_text("md5:" + "0" * 64 + "\n")  # a SHA-256 labelled MD5
    with pytest.raises(ConfigError):
        load_hash_list(str(short))


# -- C2PA training-mining assertions -----------------------------------------------------------------

def _c2pa_signer(c2pa):
    """A signer with a throwaway CA and signing certificate (C2PA refuses self-signed signers)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                          x509.NameAttribute(NameOID.ORGANIZATION_NAME, "lait tests")])

    def usage(**on):
        flags = dict.fromkeys(("digital_signature", "content_commitment", "key_encipherment", "data_encipherment",
                               "key_agreement", "key_cert_sign", "crl_sign", "encipher_only", "decipher_only"), False)
        return x509.KeyUsage(**{**flags, **on})

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())

    def cert(subject, public_key, *extensions):
        b = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name("lait test CA"))
             .public_key(public_key).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2)))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca = cert("lait test CA", ca_key.public_key(), (x509.BasicConstraints(ca=True, path_length=0), True),
              (usage(key_cert_sign=True, crl_sign=True), True),
              (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False))
    ee = cert("lait test signer", key.public_key(), (x509.BasicConstraints(ca=False, path_length=None), True),
              (usage(digital_signature=True), True),
              (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.EMAIL_PROTECTION]), False),
              (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    return lambda: c2pa.Signer.from_info(c2pa.C2paSignerInfo(b"es256", ee + ca, pem, None))


def _signed(c2pa, signer, jpeg: bytes, label: str, entries: dict) -> bytes:
    import io

    manifest = {"claim_generator_info": [{"name": "lait-tests", "version": "1"}], "format": "image/jpeg",
                "assertions": [
                    {"label": "c2pa.actions", "data": {"actions": [{
                        "action": "c2pa.created",
                        "digitalSourceType": "http://cv.iptc.org/newscodes/digitalsourcetype/digitalCapture"}]}},
                    {"label": label, "data": {"entries": entries}}]}
    out = io.BytesIO()
    with c2pa.Builder(manifest) as builder:
        builder.sign(signer(), "image/jpeg", io.BytesIO(jpeg), out)
    return out.getvalue()


def test_c2pa_training_mining_assertions(make_work, td):
    c2pa = pytest.importorskip("c2pa", reason="c2pa-python is not installed (the consent extra)")
    signer = _c2pa_signer(c2pa)
    cases = {  # url -> (assertion label, entries, reserved?)
        "ai-training-not-allowed": ("c2pa.training-mining", {"c2pa.ai_training": {"use": "notAllowed"},
                                                             "c2pa.ai_inference": {"use": "allowed"}}, True),
        "generative-not-allowed-cawg": ("cawg.training-mining",
                                        {"cawg.ai_generative_training": {"use": "notAllowed"}}, True),
        "mining-constrained": ("c2pa.training-mining", {"c2pa.data_mining": {"use": "constrained",
                                                                             "constraint_info": "ask us"}}, True),
        "all-allowed": ("c2pa.training-mining", {k: {"use": "allowed"} for k in (
            "c2pa.ai_training", "c2pa.ai_generative_training", "c2pa.data_mining")}, False),
        "only-inference-not-allowed": ("c2pa.training-mining", {"c2pa.ai_inference": {"use": "notAllowed"}}, False),
    }
    work = make_work()
    rows = [td.image_row(f"http://site.test/{name}.jpg",
                         _signed(c2pa, signer, td.encode(td.photo(i, 420, 340)), label, entries))
            for i, (name, (label, entries, _)) in enumerate(cases.items())]
    td.write_table(work, "images", rows, "image_url")
    run_filter(work)
    kept, rejected = outcome(work)
    assert kept == {f"http://site.test/{n}.jpg" for n, c in cases.items() if not c[2]}
    assert {u: r[0] for u, r in rejected.items()} == {
        f"http://site.test/{n}.jpg": "filter/dmi_reserved" for n, c in cases.items() if c[2]}
    assert rejected["http://site.test/mining-constrained.jpg"][1] == \
        "C2PA c2pa.training-mining: c2pa.data_mining constrained"


# -- PDQ perceptual hashes ---------------------------------------------------------------------------

def _threatexchange_hex(bits) -> str:
    """A PDQ hash as ThreatExchange writes it: 16 words of 16 bits, word 15 first, where pdqhash's
    vector holds bit 255 first."""
    bit = [int(b) for b in bits][::-1]  # bit[k] is hash bit k
    words = [sum(bit[16 * j + i] << i for i in range(16)) for j in range(16)]
    return "".join(f"{words[j]:04x}" for j in reversed(range(16)))


def test_pdq_list_catches_resized_reencoded_copies(make_work, td, shared_data, tmp_path):
    pdqhash = pytest.importorskip("pdqhash", reason="pdqhash is not installed (the pdq extra)")
    import numpy as np

    photos = sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[:10]
    listed_photo, other_listed = photos[0], photos[1]
    hexes = []
    for p in (listed_photo, other_listed):
        bits, quality = pdqhash.compute(np.asarray(Image.open(p).convert("RGB")))
        assert quality >= 50
        hexes.append(_threatexchange_hex(bits))
    hashes = tmp_path / "hashes"
    hashes.write_text("".join(f"pdq:{h}\n" for h in hexes))

    original = Image.open(listed_photo).convert("RGB")
    copy = original.resize((original.width * 7 // 10, original.height * 7 // 10), Image.Resampling.LANCZOS)
    rows = [td.image_row("http://photos.test/copy.jpg", td.encode(copy, quality=60))]
    rows += [td.image_row(f"http://photos.test/{p.name}", p.read_bytes()) for p in photos[2:]]
    work = make_work(n_partitions=2)
    td.write_table(work, "images", rows, "image_url")
    run_filter(work, exclude_hashes=str(hashes), min_side=64)
    kept, rejected = outcome(work)
    assert set(rejected) == {"http://photos.test/copy.jpg"}
    reason, detail = rejected["http://photos.test/copy.jpg"]
    assert reason == "filter/excluded_hash" and detail.startswith(f"pdq {hexes[0]} (distance ")
    assert kept == {f"http://photos.test/{p.name}" for p in photos[2:]}


def test_pdq_entries_are_checked(tmp_path):
    bad = tmp_path / "bad"
    bad.write_text("pdq:1234\n")
    with pytest.raises(ConfigError, match="not a PDQ hash"):
        load_hash_list(str(bad))


def test_a_changed_hash_list_redoes_the_filter(make_work, td, tmp_path):
    work = make_work()
    data = {f"http://site.test/{i}.jpg": td.encode(td.photo(i, 420, 340)) for i in range(3)}
    td.write_table(work, "images", [td.image_row(u, d) for u, d in data.items()], "image_url")
    listed = tmp_path / "hashes"
    listed.write_text(hashlib.sha256(data["http://site.test/0.jpg"]).hexdigest() + "\n")
    run_filter(work, exclude_hashes=str(listed))
    assert set(outcome(work)[1]) == {"http://site.test/0.jpg"}
    listed.write_text(listed.read_text() + hashlib.md5(data["http://site.test/1.jpg"]).hexdigest() + "\n")
    run_filter(work, exclude_hashes=str(listed))  # same path, new content: the partition is redone
    assert set(outcome(work)[1]) == {"http://site.test/0.jpg", "http://site.test/1.jpg"}


def test_a_reencoded_photo_records_the_stored_and_the_fetched_digest(make_work, td, shared_data, tmp_path):
    """Issue 59: a PNG or CMYK JPEG is stored as a JPEG; its row's sha256 is the stored bytes'
    digest (what stage 5 checks and ships), fetched_sha256 the served file's, and a hash list
    is matched against the file as fetched, as its maintainers hashed it."""
    photos = sorted((shared_data / "photos" / "coco_train").glob("*.jpg"))[:3]
    with Image.open(photos[0]) as a, Image.open(photos[1]) as b:
        files = {"http://photos.test/a.png": td.encode(a, "PNG"),
                 "http://photos.test/b.jpg": td.encode(b.convert("CMYK"), "JPEG", quality=90),
                 "http://photos.test/c.jpg": photos[2].read_bytes()}
    listed = tmp_path / "hashes.txt"
    with Image.open(photos[0]) as a:  # the PNG of a second URL is listed
        files["http://photos.test/listed.png"] = td.encode(a.rotate(90, expand=True), "PNG")
    listed.write_text(f"sha256:{hashlib.sha256(files['http://photos.test/listed.png']).hexdigest()}\n")
    work = make_work()
    td.write_table(work, "images", [td.image_row(u, d) for u, d in files.items()], "image_url")
    run_filter(work, exclude_hashes=str(listed))
    kept = {r["image_url"]: r for r in work.iter_rows("images_ok")}
    assert set(kept) == {"http://photos.test/a.png", "http://photos.test/b.jpg", "http://photos.test/c.jpg"}
    for url, row in kept.items():
        assert row["sha256"] == hashlib.sha256(row["bytes"]).hexdigest(), url
        assert row["fetched_sha256"] == hashlib.sha256(files[url]).hexdigest(), url
    assert kept["http://photos.test/c.jpg"]["bytes"] == files["http://photos.test/c.jpg"]  # kept as it came
    assert kept["http://photos.test/a.png"]["sha256"] != kept["http://photos.test/a.png"]["fetched_sha256"]
    assert (kept["http://photos.test/a.png"]["format"], kept["http://photos.test/b.jpg"]["format"]) == ("PNG", "JPEG")
    assert outcome(work)[1]["http://photos.test/listed.png"][0] == "filter/excluded_hash"
