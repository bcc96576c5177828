"""Stage 5 of LAIT: image-text aggregation into WebDataset shards, the stats report, and the
`lait build`, `lait stats`, `lait run` and `lait demo` commands.

`lait.build.pipeline.build(cfg)` runs the three passes of `lait build` (see `lait.build.aggregate` and
`lait.build.shards`); `lait.build.report` turns a work directory into the HTML report and the terminal
summary.
"""
