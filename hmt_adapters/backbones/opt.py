"""OPT: learned absolute positions (offset by 2 inside the model) and a projected embedding width."""

from __future__ import annotations

import torch
from torch import nn

from .base import BackboneAdapter


class OPTAdapter(BackboneAdapter):
    """OPT's input embeddings and the head's input live in `word_embed_proj_dim`, not `hidden_size`."""

    model_types = ("opt",)
    family = "learned_positions"
    supports_attention_memory = True

    @property
    def decoder_layers(self) -> list[nn.Module]:
        return list(self.body_module.decoder.layers)

    def attention_input(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        block = self.decoder_layers[layer]
        return block.self_attn_layer_norm(hidden) if block.do_layer_norm_before else hidden  # OPT-350m is post-LN

    def layer_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.decoder_layers[layer].self_attn
        x = self.attention_input(layer, hidden)
        return self._split_heads(attn.k_proj(x), self.num_heads), self._split_heads(attn.v_proj(x), self.num_heads)

    def layer_query(self, layer: int):
        block = self.decoder_layers[layer]
        norm = block.self_attn_layer_norm.weight if block.do_layer_norm_before else None
        return block.self_attn.q_proj.weight, block.self_attn.q_proj.bias, norm
