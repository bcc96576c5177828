"""The registry of drop reasons (lait.reasons) and the code agree, both ways; every reject path
refuses an unregistered reason; each command's --help lists its stage's reasons.

The code side is read statically: the first argument of every call that records a drop
(`reject`, `ImageRejected`, `PageRejected`, `PageTimeout`, `Damage`, `RejectedItem`), the
`name` of every `Filter` subclass, the `reason` of the crawler's refusal exceptions (a string
or a constant of `crawler/reasons.py` or its own module), values assigned to a variable `rule`, the `(rule, detail)`
tuples of the few functions that return one, and the fetch rules of stages 2 and 3. What a
scan cannot see (a rule computed at run time) still meets `check` when a test writes it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lait.reasons import FETCH_RULES, REASONS, check, fetch_rule, http_error, reasons_of

REPO = Path(__file__).resolve().parents[2]
STAGES = ("crawl", "ingest", "download", "filter", "clean", "score", "build", "select")
# Source file -> the stage prefix of the bare rules it writes (None: it writes whole reasons).
SOURCES = {
    "crawler/spiders/lait.py": None,
    "crawler/hosts.py": None,
    "crawler/robots.py": None,
    "crawler/tdmrep.py": None,
    "crawler/exclusions.py": "crawl",
    "crawler/warc_ingest.py": "ingest",
    "crawler/warc.py": "ingest",
    "crawler/url_list.py": "download",
    "filters/image_stage.py": "filter",
    "filters/image_decode.py": "filter",
    "filters/html_pages.py": "clean",
    "filters/extract_stage.py": "clean",
    "filters/text_stage.py": "clean",
    "filters/text_rules.py": "clean",
    "filters/text_junk.py": "clean",
    "scoring/stage.py": "score",
    "build/aggregate.py": "build",
    "build/pick.py": None,
    "build/shards.py": None,
    "build/curate.py": None,
}
DROP_CALLS = {"reject", "_rejected", "_drop", "ImageRejected", "PageRejected", "PageTimeout", "Damage", "RejectedItem"}
RULE_FUNCTIONS = {"sniff", "_duplicate_rule"}  # return (rule, detail)


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    return set()


def _constants(tree: ast.AST) -> dict[str, str]:
    """Module-level NAME = "string" assignments."""
    return {t.id: node.value.value for node in getattr(tree, "body", []) if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for t in node.targets if isinstance(t, ast.Name)}


CRAWL_CONSTANTS = _constants(ast.parse((REPO / "crawler/reasons.py").read_text()))


def _rules_in(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    names = {**CRAWL_CONSTANTS, **_constants(tree)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):  # refusal exceptions: `reason = "crawl/..."` or a constant
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and [getattr(t, "id", "") for t in stmt.targets] == ["reason"]:
                    value = stmt.value
                    found |= {names[value.id]} if isinstance(value, ast.Name) and value.id in names \
                        else _strings(value)
        if isinstance(node, ast.Call) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in DROP_CALLS:
                found |= _strings(node.args[0])
        elif isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") in ("Filter", "RegexFilter") for b in node.bases):
            for stmt in node.body:  # `name = "rule"`, `name: ClassVar[str] = "rule"`, `rules = ("a", "b")`
                targets = stmt.targets if isinstance(stmt, ast.Assign) else \
                    [stmt.target] if isinstance(stmt, ast.AnnAssign) and stmt.value else []
                if [getattr(t, "id", "") for t in targets] == ["name"]:
                    found |= _strings(stmt.value)
                elif [getattr(t, "id", "") for t in targets] == ["rules"] and isinstance(stmt.value, ast.Tuple):
                    found |= {s for e in stmt.value.elts for s in _strings(e)}
        elif isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["rule"]:
            found |= _strings(node.value)
        elif isinstance(node, ast.FunctionDef) and node.name in RULE_FUNCTIONS:
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple):
                    found |= _strings(ret.value.elts[0])
    return found


def _address_kinds() -> set[str]:
    """What `classify_address` can return: a non-public kind is the reason crawl/refused_KIND."""
    tree = ast.parse((REPO / "crawler/addresses.py").read_text())
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "classify_address"]
    return {s for r in ast.walk(fn) if isinstance(r, ast.Return) for s in _strings(r.value)} - {"public"}


def written_reasons() -> set[str]:
    out: set[str] = set()
    for path, stage in SOURCES.items():
        for rule in _rules_in(ast.parse((REPO / path).read_text())):
            # As `PartContext.reject` does: a rule that holds a slash is a whole reason already
            # (stage 3's extraction pass, stage `clean_pages`, writes `clean/` reasons).
            out.add(rule if stage is None or "/" in rule else f"{stage}/{rule}")
    out |= {f"crawl/refused_{kind}" for kind in _address_kinds()}
    out |= {f"filter/{rule}" for rule in FETCH_RULES["images"]}
    out |= {f"clean/{rule}" for rule in FETCH_RULES["pages"]}
    return out


def test_the_scan_sees_every_kind_of_drop():
    written = written_reasons()
    # One of each way the code names a rule, so that the scan cannot quietly go blind.
    assert {"crawl/robots", "crawl/robots_unreachable", "crawl/host_down", "crawl/tdm_reserved",
            "crawl/refused_loopback", "ingest/bad_http", "ingest/truncated_gzip",
            "filter/min_side", "filter/svg", "filter/corrupt", "filter/noai", "clean/timeout",
            "clean/language", "score/decode_error", "build/near_duplicate", "build/no_image",
            "build/unreadable"} <= written


def test_every_reason_the_code_writes_is_registered():
    assert sorted(written_reasons() - REASONS.keys()) == []


def test_every_registered_reason_is_written_somewhere():
    registered = {r for r in REASONS if r.split("/")[0] in STAGES}
    assert sorted(registered - written_reasons()) == []


def test_reasons_are_stage_slash_rule_with_one_sentence():
    for reason, meaning in REASONS.items():
        stage, _, rule = reason.partition("/")
        assert stage and rule and "/" not in rule and rule == rule.lower(), reason
        assert meaning[:1].islower() and meaning.endswith("."), reason  # shown after the name


def test_every_reject_path_refuses_an_unregistered_reason(tmp_path):
    from lait.build.aggregate import Image, RejectSink
    from lait.crawler.items import RejectedItem
    from lait.parts import PartContext
    from lait.workdir import WorkDir

    work = WorkDir(tmp_path, n_partitions=2).init()
    with pytest.raises(ValueError, match="unregistered drop reason 'filter/no_such_rule'"):
        PartContext(work, "filter", 0).reject("no_such_rule", image_url="u")
    with pytest.raises(ValueError, match="crawl/no_such_rule"):
        RejectedItem("crawl/no_such_rule", page_url="u")
    image = Image("u", "0" * 64, 0, 1, 1, "JPEG", "f", 0, 0, [])
    with pytest.raises(ValueError, match="build/no_such_rule"):
        RejectSink(work).reject("no_such_rule", image)
    check("filter/min_side")


def test_each_command_help_lists_its_stage_reasons():
    from lait.app.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for command, stage in (("crawl", "crawl"), ("ingest-warc", "ingest"), ("download", "download"),
                           ("download", "crawl"), ("ingest-warc", "crawl"), ("filter", "filter"),
                           ("clean", "clean"), ("score", "score"), ("build", "build"), ("select", "select")):
        text = commands[command].format_help()
        for reason in reasons_of(stage):
            assert reason in text, (command, reason)
    for command in ("crawl", "ingest-warc", "download"):
        assert "http_<N>" in commands[command].format_help()


def test_status_vocabulary():
    assert [http_error(s) for s in (200, 204, 301, 404, 503)] == [None, None, "http_301", "http_404", "http_503"]
    assert fetch_rule(None, "pages") is None
    assert fetch_rule("http_404", "images") == "status" and fetch_rule("status_404", "pages") == "status"
    assert fetch_rule("download/TimeoutError", "pages") == "download"
    assert fetch_rule("noai", "pages") == fetch_rule("noai", "images") == "noai"
    assert fetch_rule("not_html", "pages") == "not_html" and fetch_rule("empty", "images") == "empty"
    with pytest.raises(ValueError, match="not_image"):
        fetch_rule("not_image", "pages")  # a page is never "not an image"
