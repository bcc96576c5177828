"""Stage 5 of LAIT: image-text aggregation into WebDataset shards, and the subsets cut from its pool.

`lait.build.pipeline.build(cfg)` runs the passes of `lait build` (`lait.build.pick`,
`lait.build.aggregate`, `lait.build.shards`, where each picture is searched for faces as it is
written: `lait.build.faces`); `lait.build.select` cuts other shards from the pool (`lait select`,
recipes: `lait.build.curate`); `lait.build.export` writes other layouts. The commands, the
report and `lait stats` live in the app layer (`lait/app/`).
"""
