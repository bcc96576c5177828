"""The test kit: the built-in local webs and what is trained or drawn from their scenes.

- `generator`, `scenes`, `server`: the synthetic site `lait demo` crawls, served on loopback,
  with its ground truth (`groundtruth` compares built shards against it);
- `realweb`: real article pages of ../shared/data served locally with their images reachable;
- `demo_scorer`: the tiny open_clip scorer trained on the scenes (`lait score --model demo`
  loads what it builds);
- `synthetic_shards`: small shards of drawn scenes for the trainer's tests.

Only the app layer (`lait demo`, `lait serve-site`), tests and benchmarks import it.
"""
