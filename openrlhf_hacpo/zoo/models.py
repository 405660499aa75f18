"""Model architectures of the tiny agents: real ``transformers`` causal LMs built from configs (no downloads)."""
from __future__ import annotations

import dataclasses

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
)

__all__ = ["MODEL_FAMILIES", "ModelSpec", "build_model", "generation_config_for", "num_parameters"]

MODEL_FAMILIES = ("llama", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Shape of a tiny causal LM. ``head_dim`` defaults to ``hidden_size // num_heads``, ``num_kv_heads`` to
    ``num_heads`` and ``intermediate_size`` to ``3 * hidden_size``; embeddings are tied by default."""

    family: str
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int | None = None
    num_kv_heads: int | None = None
    intermediate_size: int | None = None
    max_position_embeddings: int = 128
    tie_word_embeddings: bool = True
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.family not in MODEL_FAMILIES:
            raise ValueError(f"ModelSpec.family must be one of {MODEL_FAMILIES}, got {self.family!r}")
        for name in ("hidden_size", "num_layers", "num_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"ModelSpec.num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size}) "
                "unless head_dim is given"
            )
        if self.num_heads % self.kv_heads:
            raise ValueError(f"ModelSpec.num_kv_heads ({self.kv_heads}) must divide num_heads ({self.num_heads})")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    def config_kwargs(self) -> dict:
        return dict(
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim or self.hidden_size // self.num_heads,
            intermediate_size=self.intermediate_size or 3 * self.hidden_size,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            rms_norm_eps=self.rms_norm_eps,
        )


def generation_config_for(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int = 40) -> GenerationConfig:
    """Greedy defaults with the tokenizer's special ids (saved next to the weights)."""
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )


def build_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (sdpa attention, float32) sized for
    ``tokenizer``; the initial weights depend only on ``seed``."""
    config_cls = LlamaConfig if spec.family == "llama" else Qwen3Config
    config = config_cls(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **spec.config_kwargs(),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.generation_config = generation_config_for(tokenizer)
    return model


def num_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
