"""Llama-family decoders (Llama, Mistral, Qwen2): RoPE positions, grouped-query attention."""

from __future__ import annotations

import torch
from torch import nn

from .base import BackboneAdapter


class LlamaAdapter(BackboneAdapter):
    """Pre-norm RoPE decoders whose `base_model` exposes `rotary_emb` and `layers[i].self_attn`."""

    model_types = ("llama", "mistral", "qwen2")
    family = "rope"
    supports_attention_memory = True

    @property
    def decoder_layers(self) -> list[nn.Module]:
        return list(self.body_module.layers)

    def attention_input(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder_layers[layer].input_layernorm(hidden)

    def layer_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.decoder_layers[layer].self_attn
        x = self.attention_input(layer, hidden)
        return self._split_heads(attn.k_proj(x), self.num_kv_heads), self._split_heads(attn.v_proj(x), self.num_kv_heads)

    def layer_query(self, layer: int):
        block = self.decoder_layers[layer]
        q = block.self_attn.q_proj
        return q.weight, q.bias, block.input_layernorm.weight
