"""The test kit: the built-in local webs and what is trained or drawn from their scenes.

- `generator`, `scenes`, `server`: the synthetic site `lait demo` crawls, served on loopback,
  with its ground truth (`groundtruth` compares built shards against it);
- `realweb`: real article pages of ../shared/data served locally with their images reachable;
- `demo_scorer`: the tiny open_clip scorer trained on the scenes (`lait score --model demo`
  loads what it builds);
- `heldout`, `hostile`: the demo web's held-out photos and its hostile hosts.

This is product code: `lait demo`, `lait serve-site` and `lait compare` run it, and `lait score
--model demo` trains and loads the demo scorer. What only tests and benchmarks use lives in
`tests/kit/`, outside the wheel.
"""
