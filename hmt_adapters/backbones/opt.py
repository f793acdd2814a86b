"""OPT: learned absolute positions (offset by 2 inside the model) and a projected embedding width."""

from __future__ import annotations

from .base import BackboneAdapter


class OPTAdapter(BackboneAdapter):
    """OPT's input embeddings and the head's input live in `word_embed_proj_dim`, not `hidden_size`; OPT-350m is
    post-LN (no norm before attention)."""

    model_types = ("opt",)
    family = "learned_positions"

    def layer_query(self, layer: int):
        block = self.decoder_layers[layer]
        norm = block.self_attn_layer_norm.weight if block.do_layer_norm_before else None
        return block.self_attn.q_proj.weight, block.self_attn.q_proj.bias, norm
