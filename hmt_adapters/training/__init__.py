"""Training a `MemoryModel` at depth: the HF `Trainer` glue, multi-stage BPTT, DeepSpeed configs, LoRA, and the
saved-tensor hooks that offload activations (`ActivationOffload`, what `offload_activations=True` uses)."""

from ..evaluation.nll import (  # perplexity lives with evaluation; named here too, as before
    corpus_nll,
    perplexity,
    perplexity_by_length,
    perplexity_ratio,
    sliding_window_nll,
    token_nll,
)
from ..runtime.offload import ActivationOffload
from .deepspeed import CONFIG_NAMES as DEEPSPEED_CONFIGS
from .deepspeed import deepspeed_config
from .lora import add_lora, lora_target_modules
from .stages import Stage, hmt_stages, segment_curriculum, train_stages
from .trainer import MemoryTrainer

__all__ = [
    "ActivationOffload",
    "DEEPSPEED_CONFIGS",
    "MemoryTrainer",
    "Stage",
    "add_lora",
    "corpus_nll",
    "deepspeed_config",
    "hmt_stages",
    "lora_target_modules",
    "perplexity",
    "perplexity_by_length",
    "perplexity_ratio",
    "segment_curriculum",
    "sliding_window_nll",
    "token_nll",
    "train_stages",
]
