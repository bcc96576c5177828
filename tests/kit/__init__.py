"""The test kit: what only tests and benchmarks use, kept out of the wheel.

- `pipeline_kit`, `build_data`, `scoring_data`: work directories and tiny models for the stage
  tests (`pipeline_kit` crawls the generated site of `lait.testkit`);
- `photos`, `photo_shards`, `synthetic_shards`: photo webs, shards of real photos and of drawn
  scenes for the download, trainer and learning tests;
- `raycluster`, `processes`: a local Ray cluster of separate nodes and process helpers;
- `toy_stage`: a small deterministic stage for the executor tests;
- `fuzz`: the fuzz targets (`scripts/fuzz.py`, `make fuzz`); `wat`: WAT records for the WARC tests.

pytest puts `tests/` on `sys.path` (`pythonpath` in pyproject.toml), so tests import it as
`kit`; benchmarks put it there themselves. What `lait demo`, `lait serve-site`, `lait compare`
and the demo scorer run is product code, in `lait.testkit`.
"""
