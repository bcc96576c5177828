"""Fuzz: the page reader on mutated, generated and random pages never raises (see
`tests/kit/fuzz.py` (`page_reader`))."""

from __future__ import annotations

import pytest

pytest.importorskip("hypothesis")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st

from kit.fuzz import ENCODINGS, mutate, page_reader, page_seeds  # noqa: E402

pytestmark = pytest.mark.fuzz

EDITS = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1 << 20), st.integers(0, 255)), max_size=16)
URLS = st.one_of(st.sampled_from(["a.jpg", "/b c.jpg", "//x.test/y", "../../z", "http://[::1", "data:,", "#f",
                                  "https://ex.test/?q=1#x", "\\\\host\\share", "ja\tvascript:x", "http://ü.test/ä"]),
                 st.text(max_size=40))
ATTRS = st.sampled_from(["src", "srcset", "data-src", "data-srcset", "href", "content", "property", "name", "rel",
                         "alt", "charset"])


@st.composite
def element(draw, children):
    tag = draw(st.sampled_from(["img", "picture", "source", "a", "area", "base", "meta", "div", "p", "figure",
                                "figcaption", "table", "td", "svg", "script", "li"]))
    attrs = "".join(f' {draw(ATTRS)}="{draw(URLS).replace(chr(34), "")}"' for _ in range(draw(st.integers(0, 3))))
    inner = "".join(draw(st.lists(children, max_size=4)))
    close = draw(st.sampled_from([f"</{tag}>", "", "</div>", "</p>"]))
    return f"<{tag}{attrs}>{inner}{close}"


MARKUP = st.recursive(st.text(max_size=20), lambda children: element(children), max_leaves=30)


@given(st.sampled_from(page_seeds()), EDITS, st.sampled_from(ENCODINGS))
def test_mutated_pages(seed, edits, encoding):
    page_reader(mutate(seed, edits), encoding)


@given(MARKUP, st.sampled_from(ENCODINGS), st.sampled_from(["utf-8", "utf-16", "latin-1"]))
def test_generated_markup(markup, encoding, wire):
    page_reader(markup.encode(wire, errors="replace"), encoding)


@given(st.binary(max_size=2048), st.sampled_from(ENCODINGS))
def test_random_bytes(data, encoding):
    page_reader(data, encoding)
