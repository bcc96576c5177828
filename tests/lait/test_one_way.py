"""One way each (issue 37): the things lait had written by hand in several places, each drifting
from the others, now have one definition; these scans keep callers from growing their own."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("lait", "crawler", "filters", "scoring", "build", "train")


def modules(*roots: str) -> dict[str, ast.AST]:
    return {str(p.relative_to(REPO)): ast.parse(p.read_text(), str(p))
            for root in roots for p in sorted((REPO / root).rglob("*.py"))}


def calls(tree: ast.AST, name: str) -> int:
    """Calls of `name(...)` or `x.name(...)` in a module."""
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        getattr(n.func, "attr", None) == name or getattr(n.func, "id", None) == name))


def where_called(name: str, roots: tuple[str, ...] = PACKAGES) -> list[str]:
    return sorted(path for path, tree in modules(*roots).items() if calls(tree, name))


def test_filter_verdicts_are_read_in_one_place():
    # `keep` results are read by `lait.rules.first_rejection` only (stages call that).
    assert where_called("keep") == ["lait/rules.py"]


def test_executors_are_made_from_a_config_in_one_place():
    assert where_called("make_executor") == ["lait/executor.py"]


def test_global_steps_run_through_one_runner():
    # Fingerprint check, cause line, clear, run, marker: `lait.stage.run_global_step`.
    assert where_called("global_step_cause") == ["lait/stage.py"]
    assert where_called("run_global_step") == [
        "build/pipeline.py", "build/select.py", "filters/site_texts.py", "scoring/neardup.py", "scoring/regions.py"]


def test_the_trainer_is_set_up_in_one_place():
    assert where_called("Trainer") == []  # constructed by `Trainer.for_run` (a classmethod: `cls(...)`)
    assert where_called("for_run") == ["train/finetune.py", "train/pretrain.py"]


def test_tests_import_their_data_builders_from_the_test_kit():
    # Loading a helper module by file path (a copy per test file) is how the loaders drifted;
    # the two left load a `conftest.py`, which pytest itself owns.
    for path, tree in modules("tests").items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "spec_from_file_location":
                assert "conftest" in ast.unparse(node), f"{path}: {ast.unparse(node)}"


def test_train_uses_absolute_imports_like_the_rest_of_lait():
    relative = [f"{path}:{n.lineno}" for path, tree in modules(*PACKAGES).items() for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.level]
    assert relative == []


def test_table_schemas_are_declared_in_one_place():
    # Issue 60: every table of the work directory is a `Table` of `lait.schemas.TABLES`; stages
    # read their schemas with `get_table` and never register one of their own at import time
    # (`register_table` stays for code outside lait that adds a table).
    assert where_called("Table") == ["lait/schemas.py"]
    assert where_called("register_table") == []


def test_stages_are_launched_by_one_function():
    # Issue 60: `lait.drivers.run_stage` opens the work directory, locks it, runs the stage (its
    # `before` stages, global steps, partitions, `after_steps`) on the configured executor and
    # records the run; stage 5's build is a stage of it too (`BuildStage`: the pick pass, its
    # plan and shards as after-steps), so are `lait documents` (`DocumentsPasses`: stage 3's
    # document pass, stage 4's similarities and the writers as after-steps) and `lait select`
    # (`SelectStage`: the shard pass in its folder's `_select/`, its own `workspace`). Only it
    # builds an executor for a stage.
    assert where_called("executor_for") == ["lait/drivers.py"]
    assert where_called("stage_executor") == ["lait/drivers.py"]
    assert where_called("make_executor") == ["lait/executor.py"]


REJECTED_RAISED = {"ImageRejected", "PageRejected"}


def _first_literal(node: ast.Call) -> str | None:
    arg = node.args[0] if node.args else None
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def test_rows_are_dropped_one_way():
    # Issue 60, one way to drop a row: a rule decides (a `Filter` of a stage's list, read by
    # `first_rejection`, which names the rule as a `Drop`; or, deep inside a decoder, a
    # `Rejected` raised and caught by the stage's loop over its rows), and `PartContext.reject`
    # (its writer's `reject` for the passes that have no task context) records it. That every
    # reason so written is registered, `tests/lait/test_reasons.py` reads statically.
    caught: dict[str, int] = {}
    raised: set[str] = set()
    for path, tree in modules(*PACKAGES).items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and \
                    getattr(n.exc.func, "id", None) in REJECTED_RAISED:
                raised.add(path)
            elif isinstance(n, ast.ExceptHandler) and n.type is not None and \
                    REJECTED_RAISED & {getattr(x, "id", None) for x in ast.walk(n.type)}:
                caught[path] = caught.get(path, 0) + 1
            elif isinstance(n, ast.Call) and getattr(n.func, "attr", None) in ("write", "writer", "output") and \
                    _first_literal(n) == "rejected":
                assert path == "lait/parts.py", f"{path}:{n.lineno} writes rejected/ itself"
    # Only the decoders raise (of images; of pages: decoding, parsing, the time limit); a stage's
    # own rules are filters (stage 2: `ImageFilterStage.rules`) or `reject` calls.
    assert raised == {"filters/image_decode.py", "filters/html_pages.py"}
    # Each stage catches its decoders' rejections once, in its loop over rows.
    assert caught == {"filters/documents.py": 1, "filters/extract_stage.py": 1, "filters/image_stage.py": 1}


# Where a stage still calls `reject` itself, by module (`PartContext.reject` and the writers'
# `reject` that record a drop are in lait/parts.py). Each is a rule that no single-record test
# decides (stage 3's one-owner pass and learned judge, stage 5's groups and plan) or one of the
# passes not yet turned into Filters (issue 60: the WARC and URL list ingests, the build's
# per-image checks).
# A new drop goes into a stage's list of Filters; a new entry here needs a reason of that kind.
REJECT_CALLS = {
    "build/aggregate.py": 8, "build/documents.py": 1, "build/pick.py": 1, "build/select.py": 2,
    "build/shards.py": 1, "crawler/pipelines.py": 1, "crawler/url_list.py": 5, "crawler/warc_ingest.py": 8,
    "filters/documents.py": 3, "filters/extract_stage.py": 2, "filters/image_stage.py": 2,
    "filters/text_stage.py": 6, "lait/parts.py": 1, "scoring/stage.py": 1,
}


def test_reject_is_called_only_where_no_filter_decides():
    found = {path: calls(tree, "reject") for path, tree in modules(*PACKAGES).items() if calls(tree, "reject")}
    assert found == REJECT_CALLS
