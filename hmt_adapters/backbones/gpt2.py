"""GPT-2: learned absolute positions (`n_positions`), fused `c_attn` projection."""

from __future__ import annotations

import torch
from torch import nn

from .base import BackboneAdapter


class GPT2Adapter(BackboneAdapter):
    """GPT-2 names its sizes `n_embd`/`n_head`/`n_layer`; the config's attribute map exposes the usual names."""

    model_types = ("gpt2",)
    family = "learned_positions"
    supports_attention_memory = True

    @property
    def decoder_layers(self) -> list[nn.Module]:
        return list(self.body_module.h)

    def attention_input(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder_layers[layer].ln_1(hidden)

    def layer_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        attn = self.decoder_layers[layer].attn
        _, k, v = attn.c_attn(self.attention_input(layer, hidden)).split(attn.split_size, dim=2)  # fused Conv1D
        return self._split_heads(k, self.num_heads), self._split_heads(v, self.num_heads)

    def layer_query(self, layer: int):
        block = self.decoder_layers[layer]
        d = block.attn.split_size
        conv = block.attn.c_attn  # Conv1D weight is [d_in, 3 d]: transpose to the nn.Linear layout
        return conv.weight[:, :d].t(), conv.bias[:d], block.ln_1.weight
