"""What a backbone must be for memory to wrap it: a decoder-only causal LM, plain or under a peft tuner adapter.

(`MemoryModel` itself is refused by `model.check_wrappable`, so this package never imports the model.)
"""

from __future__ import annotations

from torch import nn
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
)

from .base import unwrap_causal_lm


def is_peft(model: nn.Module) -> bool:
    """Whether `model` is a peft model around a causal LM."""
    return unwrap_causal_lm(model) is not model


def check_causal_lm(model: nn.Module) -> None:
    """Refuse a bidirectional or encoder-decoder model (its tokens see later ones, so the memory would leak the
    future), a prompt-learning peft model, and a body that needs token ids beside their embeddings."""
    inner = unwrap_causal_lm(model)
    for name, peft_config in (getattr(model, "peft_config", None) or {}).items() if inner is not model else ():
        if getattr(peft_config, "is_prompt_learning", False):
            raise NotImplementedError(
                f"peft adapter {name!r} is {peft_config.peft_type} (prompt learning: virtual tokens added by "
                "PeftModel.forward), which memory models bypass; use a tuner adapter (LoRA, IA3, LoHa, LoKr, ...)."
            )
    config = getattr(inner, "config", None)
    if config is None:
        return  # not a HF model: get_backbone_adapter says what it expects
    cls, model_type = type(inner).__name__, getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"{cls} is an encoder-decoder model; memory wraps decoder-only causal LMs (AutoModelForCausalLM)."
        )
    causal = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type or "")
    non_causal = {*MODEL_FOR_MASKED_LM_MAPPING_NAMES.values(), *MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values()}
    if cls in non_causal and cls not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        hint = f" ({model_type}'s causal LM is {causal}, with is_decoder=True)" if causal else ""
        raise ValueError(
            f"{cls} is not a causal LM: its tokens attend to later tokens, so memory would leak the future{hint}."
        )
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        raise ValueError(
            f"{cls} ({model_type}) runs as a bidirectional encoder because config.is_decoder is False: its tokens "
            "would see later tokens. Build it with is_decoder=True to use it as a causal LM."
        )
    per_layer = getattr(config, "hidden_size_per_layer_input", None)
    if per_layer:
        raise NotImplementedError(
            f"{cls} ({model_type}) feeds every layer an embedding looked up by token id (per-layer inputs, "
            f"config.hidden_size_per_layer_input={per_layer}). Memory runs the body from input embeddings, which "
            "this family maps back to ids by an exact match against its whole vocabulary: memory slots match no "
            "token, and the match compares segment x vocabulary x hidden-size entries (hundreds of GB at a real "
            "model's shape). Checkpoints built with hidden_size_per_layer_input=0 are supported."
        )
