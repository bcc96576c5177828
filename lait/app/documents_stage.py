"""`lait documents` as one stage of the launcher: stage 3's document pass, then stage 4's and 5's.

The three passes belong to three stage folders that never import each other; the app layer
joins them here. `DocumentsPasses` is stage 3's `DocumentStage` (same name, version, settings
and partitions, so its parts and markers are those the pass always wrote) whose after-steps,
once every partition succeeded, run stage 4's `DocSimStage` on the launcher's executor and,
when that succeeds, write the documents (`lait.build.documents.write_documents`).
"""

from __future__ import annotations

from typing import Any, Callable

from lait.build.documents import write_documents
from lait.filters.documents import DocumentStage
from lait.scoring.documents import DocSimStage


class DocumentsPasses(DocumentStage):
    """Stage 3's document pass with stage 4's similarities and stage 5's writers after it.
    After the run, `reports`: the similarities' report (none when the first pass failed);
    `stats`: the written documents' stats (None when a pass failed)."""

    def __init__(self, clean: Any, score: Any, cfg: Any):
        super().__init__(clean)
        self.score, self.command = score, cfg
        self.reports: list = []
        self.stats: dict | None = None

    def after_steps(self, work, report, run: Callable[..., Any]) -> list:
        sims = run(DocSimStage(self.score))
        self.reports = [sims]
        if sims.ok:
            self.stats = write_documents(self.command)
        return self.reports
