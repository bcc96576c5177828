"""Stage 4 of LAIT: image-text semantic scoring with open_clip, embeddings, regions, near-duplicates.

`lait score WORK` (`scoring.command`) runs `scoring.pipeline.score_work(ScoreConfig)`:

1. `ScoreStage` (`scoring.stage`), per partition: joins `candidates/` with `images_ok/` (both
   partitioned by image URL), encodes each distinct text once, decodes images in worker processes
   (`scoring.decode`) while the model runs, and writes one `scored/` row per (image, text) pair:
   `score` is the cosine of the L2-normalised open_clip embeddings; `model` and `pretrained`
   name the weights; `image_emb_ref` / `text_emb_ref` index the partition's `image_embs/` /
   `text_embs/` rows (fp16, normalised). With `regions`, `regions/` holds the ViT patch tokens
   pooled to at most `max_regions` cells (fp16) with their normalised boxes.
2. `near_dups/`: image pairs whose embeddings have cosine >= `near_dup_threshold`, found with
   faiss over all partitions (`scoring.neardup`), for stage 5's grouping.
3. With `regions`: a faiss k-means codebook over the region features (`WORK/score_codebook/`)
   and `region_labels/` (each region's nearest centroid: the MOC class), `scoring.regions`.

Table layouts and array helpers (`load_regions`, `stack_embs`, `emb_array`) are in
`scoring.tables`; stage 5 writes `KEY.regions.npy`, `KEY.boxes.npy`, `KEY.labels.npy` from
`load_regions(work, partition)[image_url]`.

Models (`scoring.model`): open_clip names with a pretrained tag or a `--checkpoint`, a model
config JSON for small models, `local-dir:`/`hf-hub:` folders, or `demo`, the offline demo
scorer the project trains itself on the built-in web's scenes (`scoring.demo_model`).
"""
