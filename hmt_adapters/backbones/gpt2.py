"""GPT-2: learned absolute positions (`n_positions`), fused `c_attn` projection."""

from __future__ import annotations

from .base import BackboneAdapter


class GPT2Adapter(BackboneAdapter):
    """GPT-2 names its sizes `n_embd`/`n_head`/`n_layer`; the config's attribute map exposes the usual names."""

    model_types = ("gpt2",)
    family = "learned_positions"
    supports_attention_memory = True
