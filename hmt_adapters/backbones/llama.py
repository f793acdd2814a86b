"""Llama-family decoders (Llama, Mistral, Qwen2): RoPE positions, grouped-query attention."""

from __future__ import annotations

from .base import BackboneAdapter


class LlamaAdapter(BackboneAdapter):
    """Pre-norm RoPE decoders whose `base_model` exposes `rotary_emb` and `layers[i].self_attn`."""

    model_types = ("llama", "mistral", "qwen2")
    family = "rope"
    supports_attention_memory = True
