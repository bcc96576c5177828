"""ImageBERT: one BERT-style transformer over ``[CLS] text [SEP] regions`` (Qi et al., 2020).

The layer layout follows Hugging Face ``BertModel`` (post-LayerNorm blocks, GELU, learned absolute
positions) so that a BERT checkpoint loads into the text side unchanged; attention goes through
``torch.nn.functional.scaled_dot_product_attention`` so CUDA picks a fused kernel.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lait.config import ConfigError, build, read_yaml_mapping

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

# Temperature of the in-batch contrastive loss on `ImageBert.embed` outputs (finetuning, and
# the optional ITC pretraining task).
TEMPERATURE = 0.05


@dataclass
class ImageBertConfig:
    """Shape of an ImageBERT model; named configs live in ``train/configs/<name>.yaml``."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_text_len: int = 512  # size of the position table (BERT's max_position_embeddings)
    type_vocab_size: int = 2
    region_feature_dim: int = 2048
    num_object_classes: int = 1601  # Visual Genome classes + background, as the paper's detector
    embed_dim: int = 256  # unimodal embedding head used for shortlists and hard-negative mining
    dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    extra: dict = field(default_factory=dict)  # free-form notes (e.g. which checkpoint it mirrors)

    @classmethod
    def named(cls, name_or_path: str) -> "ImageBertConfig":
        """Load ``train/configs/<name>.yaml`` or a YAML file path."""
        path = Path(name_or_path)
        if not path.suffix:
            path = CONFIG_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            known = sorted(p.stem for p in CONFIG_DIR.glob("imagebert-*.yaml"))
            raise ConfigError(f"model: {name_or_path!r} is no model name ({', '.join(known)}) nor a model YAML file")
        return build(cls, read_yaml_mapping(path), where=str(path))

    def to_dict(self) -> dict:
        return asdict(self)


class RegionEmbeddings(nn.Module):
    """Projected region feature + projected 5-d location (x1/W, y1/H, x2/W, y2/H, area) + segment."""

    def __init__(self, cfg: ImageBertConfig):
        super().__init__()
        self.feature_proj = nn.Linear(cfg.region_feature_dim, cfg.hidden_size)
        self.location_proj = nn.Linear(5, cfg.hidden_size)
        self.feature_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.location_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, features: torch.Tensor, locations: torch.Tensor) -> torch.Tensor:
        if features.dtype != self.feature_proj.weight.dtype and not torch.is_autocast_enabled(features.device.type):
            features = features.to(self.feature_proj.weight.dtype)  # fp16 from the shards, fp32 weights
        # Each projection is normalised (as UNITER does) so that detector/CLIP/pixel features of
        # any scale neither drown the 5-d location nor are drowned by it.
        return self.feature_norm(self.feature_proj(features)) + self.location_norm(self.location_proj(locations))


class Embeddings(nn.Module):
    """Text (WordPiece + segment + position) and region embeddings, concatenated then normalised."""

    def __init__(self, cfg: ImageBertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size, padding_idx=0)
        self.position_embeddings = nn.Embedding(cfg.max_text_len, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.regions = RegionEmbeddings(cfg)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, input_ids, region_features, region_locations, tag_ids=None) -> torch.Tensor:
        parts = []
        if input_ids is not None:
            t = input_ids.shape[1]
            pos = torch.arange(t, device=input_ids.device)
            parts.append(
                self.word_embeddings(input_ids)
                + self.position_embeddings(pos)[None]
                + self.token_type_embeddings.weight[0]
            )
        if tag_ids is not None:
            # Object tags are words of the image side: the image's segment, positions from 0 (the
            # same wherever the text's padding ends).
            pos = torch.arange(tag_ids.shape[1], device=tag_ids.device)
            parts.append(
                self.word_embeddings(tag_ids)
                + self.position_embeddings(pos)[None]
                + self.token_type_embeddings.weight[1]
            )
        if region_features is not None:
            parts.append(
                self.regions(region_features, region_locations) + self.token_type_embeddings.weight[1]
            )
        x = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, cfg: ImageBertConfig):
        super().__init__()
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)  # fused: one GEMM, not three
        self.out = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, h = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, h // self.num_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.attention_dropout if self.training else 0.0
        )
        return self.out(y.transpose(1, 2).reshape(b, n, h))


class Layer(nn.Module):
    """A post-LayerNorm BERT block."""

    def __init__(self, cfg: ImageBertConfig):
        super().__init__()
        self.attention = SelfAttention(cfg)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.intermediate = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.output = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.output_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x, attn_mask):
        x = self.attention_norm(x + self.dropout(self.attention(x, attn_mask)))
        return self.output_norm(x + self.dropout(self.output(F.gelu(self.intermediate(x)))))


class HeadTransform(nn.Module):
    """BERT's prediction-head transform: dense, GELU, LayerNorm."""

    def __init__(self, cfg: ImageBertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(F.gelu(self.dense(x)))


class ImageBert(nn.Module):
    """Encoder plus the four pretraining heads (MLM, MOC, MRFR, ITM) and an embedding head.

    ``forward`` returns the final hidden states; the heads are applied by the objectives to the
    positions that need them only (masked tokens, masked regions, ``[CLS]``).
    """

    def __init__(self, cfg: ImageBertConfig):
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_layers))
        # MLM head; its decoder weight is the word-embedding matrix (tied), only the bias is own.
        self.mlm_transform = HeadTransform(cfg)
        self.mlm_bias = nn.Parameter(torch.zeros(cfg.vocab_size))
        self.moc_head = nn.Sequential(HeadTransform(cfg), nn.Linear(cfg.hidden_size, cfg.num_object_classes))
        self.mrfr_head = nn.Sequential(HeadTransform(cfg), nn.Linear(cfg.hidden_size, cfg.region_feature_dim))
        self.pooler = nn.Linear(cfg.hidden_size, cfg.hidden_size)  # BERT's pooler, loadable from BERT
        self.itm_head = nn.Linear(cfg.hidden_size, 2)
        self.embed_head = nn.Linear(cfg.hidden_size, cfg.embed_dim)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        text_mask: torch.Tensor | None,
        region_features: torch.Tensor | None,
        region_locations: torch.Tensor | None,
        region_valid: torch.Tensor | None,
        tag_ids: torch.Tensor | None = None,
        tag_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encode a text, an image side (object tags and regions), or both, in the order
        ``[text] [tags] [regions]``; masks are bool with True = real token/region."""
        x = self.embeddings(input_ids, region_features, region_locations, tag_ids)
        keep = [m for m in (text_mask, tag_mask if tag_ids is not None else None, region_valid) if m is not None]
        key_mask = keep[0] if len(keep) == 1 else torch.cat(keep, dim=1)
        # No mask when nothing is padded; on a GPU the mask goes in regardless, as asking would
        # make the host wait for the device.
        if key_mask.device.type == "cpu" and bool(key_mask.all()):
            attn_mask = None
        else:
            attn_mask = key_mask[:, None, None, :]
        for layer in self.layers:
            x = layer(x, attn_mask)
        return x

    # ---- heads -----------------------------------------------------------------------------
    def mlm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.mlm_transform(hidden) @ self.embeddings.word_embeddings.weight.t() + self.mlm_bias

    def itm_logits(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        return self.itm_head(torch.tanh(self.pooler(cls_hidden)))

    def itm_score(self, cls_hidden: torch.Tensor) -> torch.Tensor:
        """A scalar match score per pair (logit margin), used for ranking."""
        logits = self.itm_logits(cls_hidden).float()
        return logits[:, 1] - logits[:, 0]

    @staticmethod
    def image_mask(tag_mask: torch.Tensor | None, region_valid: torch.Tensor) -> torch.Tensor:
        """The key mask of an image-side pass: its tags (when there are any), then its regions."""
        return region_valid if tag_mask is None else torch.cat([tag_mask, region_valid], dim=1)

    def embed(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """L2-normalised mean-pooled unimodal embedding (for faiss shortlists and hard negatives)."""
        m = mask.to(hidden.dtype)[..., None]
        pooled = (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
        return F.normalize(self.embed_head(pooled).float(), dim=-1)

def flops_per_token(cfg: ImageBertConfig, seq_len: int) -> float:
    """Training FLOPs per token (6N for the matmuls plus attention), for the MFU estimate."""
    n = cfg.num_layers * (4 * cfg.hidden_size**2 + 2 * cfg.hidden_size * cfg.intermediate_size)
    attn = cfg.num_layers * 2 * seq_len * cfg.hidden_size
    return 6.0 * n + 6.0 * attn

