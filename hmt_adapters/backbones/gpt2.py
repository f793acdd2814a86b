"""GPT-2: learned absolute positions (`n_positions`), fused `c_attn` projection stored as a `Conv1D`."""

from __future__ import annotations

from .base import BackboneAdapter


class GPT2Adapter(BackboneAdapter):
    """GPT-2's query projection lives in the first third of its `Conv1D` `c_attn` (`[d_in, 3 d]` weight)."""

    model_types = ("gpt2",)
    family = "learned_positions"

    def layer_query(self, layer: int):
        block = self.decoder_layers[layer]
        d = block.attn.split_size
        conv = block.attn.c_attn  # Conv1D weight is [d_in, 3 d]: transpose to the nn.Linear layout
        return conv.weight[:, :d].t(), conv.bias[:d], block.ln_1.weight
