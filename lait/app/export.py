"""`lait export-embeddings`: the shards' stored embeddings in clip-retrieval's layout."""

from __future__ import annotations

import argparse
import sys

from lait.app.commands import add_config_command

EXPORT_EPILOG = """\
examples:
  lait export-embeddings work/ --out embs/
  lait export-embeddings work/ --shards sel-028/ --out embs-028/   the samples of a selection
  clip-retrieval index --embeddings_folder embs/ --index_folder index/
"""


def run_export(cfg) -> int:
    from lait.build.export import export_embeddings

    done = export_embeddings(cfg)
    print(f"export-embeddings: {done['samples']} samples in {done['files']} files in {done['out']}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `lait export-embeddings`."""
    from lait.build.export import ExportConfig
    from lait.build.export import __doc__ as description

    add_config_command(sub, "export-embeddings", ExportConfig, run_export,
                       help="image and caption embeddings of the shards for clip-retrieval and faiss",
                       description=description, epilog=EXPORT_EPILOG)
