"""The app layer: the `lait` command and the orchestration that knows every stage.

`lait.app.cli` builds the parser from one module per command group (`crawl`, `ingest`,
`stages` for filter and clean, `score`, `build`, `train`, `site`), and the commands that
span stages: `run` (stages 2-5), `demo` (the whole job on the built-in web), `stats` (the
report, `lait.app.report`). Stages never import this package; it imports them all.
"""
