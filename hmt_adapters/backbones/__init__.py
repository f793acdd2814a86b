"""The backbone adapter of a causal LM: one generic adapter, subclassed for the few families with a quirk no structure
reveals (chosen by `config.model_type`)."""

from __future__ import annotations

from torch import nn

from .base import BackboneAdapter, RecurrentAdapter, positions_from_mask, unwrap_causal_lm
from .gpt2 import GPT2Adapter
from .mamba import MambaAdapter
from .opt import OPTAdapter
from .pretrained import smollm2, smollm2_folder
from .rwkv import RwkvAdapter
from .wrapping import is_peft

_ADAPTERS: dict[str, type[BackboneAdapter]] = {
    model_type: cls for cls in (OPTAdapter, GPT2Adapter, MambaAdapter, RwkvAdapter) for model_type in cls.model_types
}

SUPPORTED_MODEL_TYPES = tuple(sorted(_ADAPTERS))


def get_backbone_adapter(model: nn.Module) -> BackboneAdapter:
    """The adapter for `model` (a `*ForCausalLM`, possibly inside a peft `PeftModel`).

    Every family gets the generic adapter, which finds what it needs through transformers' structure; the few
    families with a quirk no structure reveals (OPT, GPT-2, SSMs, RWKV) subclass it.
    """
    causal_lm = unwrap_causal_lm(model)
    config = getattr(causal_lm, "config", None)
    if config is None or not hasattr(causal_lm, "get_input_embeddings"):
        raise TypeError(
            "Expected a Hugging Face causal LM (e.g. from AutoModelForCausalLM.from_pretrained), got "
            f"{type(model).__name__}."
        )
    return _ADAPTERS.get(getattr(config, "model_type", ""), BackboneAdapter)(causal_lm)


__all__ = [
    "BackboneAdapter",
    "RecurrentAdapter",
    "SUPPORTED_MODEL_TYPES",
    "get_backbone_adapter",
    "is_peft",
    "positions_from_mask",
    "smollm2",
    "smollm2_folder",
    "unwrap_causal_lm",
]
