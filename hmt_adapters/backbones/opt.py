"""OPT: learned absolute positions (offset by 2 inside the model) and a projected embedding width."""

from __future__ import annotations

from .base import BackboneAdapter


class OPTAdapter(BackboneAdapter):
    """OPT's input embeddings and the head's input live in `word_embed_proj_dim`, not `hidden_size`."""

    model_types = ("opt",)
    family = "learned_positions"
    supports_attention_memory = True
