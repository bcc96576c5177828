"""Stage 4 of LAIT: image-text semantic scoring with open_clip, embeddings, regions, near-duplicates.

`lait score WORK` (its command is `lait/app/score.py`) runs `lait.scoring.pipeline.score_work(ScoreConfig)`:

1. `ScoreStage` (`lait.scoring.stage`), per partition: joins `candidates/` with `images_ok/` (both
   partitioned by image URL), encodes each distinct text once, decodes images in worker processes
   (`lait.scoring.decode`) while the model runs, and writes one `scored/` row per (image, text) pair:
   `score` is the cosine of the L2-normalised open_clip embeddings; `model` and `pretrained`
   name the weights; `image_emb_ref` / `text_emb_ref` index the partition's `image_embs/` /
   `text_embs/` rows (fp16, normalised). With `regions`, `regions/` holds the ViT patch tokens
   pooled to at most `max_regions` cells (fp16) with their normalised boxes.
2. `near_dups/`: image pairs whose embeddings have cosine >= `near_dup_threshold`, found with
   faiss over all partitions (`lait.scoring.neardup`), for stage 5's grouping.
3. With `regions`: a faiss k-means codebook over the region features (`WORK/score_codebook/`)
   and `region_labels/` (each region's nearest centroid: the MOC class), `lait.scoring.regions`.

Table schemas are in `lait.schemas` and the array codecs of their binary columns in
`lait.arrays` (core), where stage 5 reads them to write `KEY.regions.npy`, `KEY.boxes.npy` and
`KEY.labels.npy`: stages meet only through tables.

Models (`lait.scoring.model`): open_clip names with a pretrained tag or a `--checkpoint`, a model
config JSON for small models, `local-dir:`/`hf-hub:` folders, or `demo`, the offline demo
scorer that the test kit trains on the built-in web's scenes (`lait.testkit.demo_scorer`) and
this stage only loads.
"""
