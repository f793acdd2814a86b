"""LoRA on the backbone, trained together with the memory parameters (HMT's recipe for 7B models).

Target modules come from peft's per-architecture defaults; `wrap_with_memory` keeps the LoRA weights trainable and
`save_pretrained` writes them beside the memory adapter.
"""

from __future__ import annotations

from collections.abc import Sequence

from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from torch import nn

from ..compat import peft_on_transformers5

# HMT App. D / reference scripts: rank 8, alpha 32, dropout 0.1
DEFAULT_RANK = 8
DEFAULT_ALPHA = 32
DEFAULT_DROPOUT = 0.1


# peft's default for Llama-style attention, used for an architecture peft has no entry for (newer than its table:
# GPT-OSS, Gemma 4, Qwen3.5, ...) whose attention projects queries and values by these names
LLAMA_STYLE_TARGETS = ["q_proj", "v_proj"]


def lora_target_modules(model: nn.Module) -> list[str]:
    """peft's default LoRA targets for `model`'s architecture (e.g. `q_proj`, `v_proj` for Llama, `c_attn` for
    GPT-2); for an architecture without an entry in peft's table, its Llama default where the model has linear
    layers of those names."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type or "")
    if targets:
        return list(targets)
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
    if set(LLAMA_STYLE_TARGETS) <= set(linear):
        return list(LLAMA_STYLE_TARGETS)
    raise ValueError(
        f"peft has no default LoRA target modules for model type {model_type!r}; pass `target_modules` "
        f"(names of the backbone's linear layers: {linear})."
    )


def add_lora(
    model: nn.Module,
    rank: int = DEFAULT_RANK,
    alpha: int = DEFAULT_ALPHA,
    dropout: float = DEFAULT_DROPOUT,
    target_modules: Sequence[str] | None = None,
) -> PeftModel:
    """Wrap a causal LM with trainable LoRA adapters (then pass it to `wrap_with_memory`)."""
    if isinstance(model, PeftModel):
        raise ValueError("The model already carries peft adapters; pass the plain causal LM to `add_lora`.")
    targets = list(target_modules) if target_modules is not None else lora_target_modules(model)
    config = LoraConfig(task_type="CAUSAL_LM", r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets)
    with peft_on_transformers5():
        return get_peft_model(model, config)
