"""`BackboneAdapter`: what the runtime needs from a causal LM, written once for HF decoder models.

Family files subclass it only for their quirks (embedding width, positions, padding, attention layout).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The `*ForCausalLM` module inside `model` (a peft `PeftModel` is unwrapped, its LoRA layers stay in place)."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base) and type(model).__name__.startswith("Peft"):
        return get_base()
    return model


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: cumulative count of real slots minus one, clamped at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class BackboneAdapter:
    """Uniform access to a HF causal LM: embeddings, the body up to the LM-head input, logits and sizes."""

    model_types: ClassVar[tuple[str, ...]] = ()
    family: ClassVar[str] = "decoder"
    has_attention: ClassVar[bool] = True
    supports_attention_memory: ClassVar[bool] = False  # attention-level memory verified for this family
    takes_position_ids: ClassVar[bool] = True

    def __init__(self, model: nn.Module):
        self.model = unwrap_causal_lm(model)
        self.config = self.model.config
        out = self.model.get_output_embeddings()
        if out is not None and out.weight.shape[-1] != self.embed_dim:
            raise NotImplementedError(
                f"'{self.model_type}': the LM head reads width {out.weight.shape[-1]} but input embeddings have width "
                f"{self.embed_dim}; memory read from the head's input cannot be fed back as an embedding."
            )

    # ---- sizes -----------------------------------------------------------------------------------------------

    @property
    def model_type(self) -> str:
        return getattr(self.config, "model_type", type(self.model).__name__)

    @property
    def embed_dim(self) -> int:
        """Width of the input-embedding space (OPT: `word_embed_proj_dim`), where memory tokens live."""
        return self.model.get_input_embeddings().weight.shape[-1]

    @property
    def vocab_size(self) -> int:
        return self.model.get_input_embeddings().weight.shape[0]

    @property
    def max_positions(self) -> int | None:
        """Largest window the position scheme supports (None: no limit)."""
        return getattr(self.config, "max_position_embeddings", None)

    def embedding_std(self) -> float:
        return float(self.model.get_input_embeddings().weight.detach().float().std())

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return getattr(self.config, "num_key_value_heads", None) or self.num_heads

    @property
    def head_dim(self) -> int:
        return getattr(self.config, "head_dim", None) or self.config.hidden_size // self.num_heads

    @property
    def body_module(self) -> nn.Module:
        return self.model.base_model

    # ---- compute ---------------------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings `[B, T] -> [B, T, d]`."""
        return self.model.get_input_embeddings()(input_ids)

    def check_mask(self, mask: torch.Tensor) -> None:
        """Raise when the family cannot honour `mask` (all families here can)."""

    def body_kwargs(self, mask: torch.Tensor, position_ids: torch.Tensor | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"attention_mask": mask, "use_cache": False}
        if self.takes_position_ids:
            kwargs["position_ids"] = position_ids if position_ids is not None else positions_from_mask(mask)
        return kwargs

    def body(self, inputs_embeds: torch.Tensor, mask: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Run the backbone without its LM head; returns the tensor the head reads, `[B, W, d]`."""
        self.check_mask(mask)
        call = {**self.body_kwargs(mask, kwargs.pop("position_ids", None)), **kwargs}
        return self.body_module(inputs_embeds=inputs_embeds, **call).last_hidden_state

    continues_multi_token: ClassVar[bool] = True  # a cached call may feed several tokens at once
    continues_cache: ClassVar[bool] = True  # a cached call continues exactly where a full read would be

    def body_cached(
        self, inputs_embeds: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor | None, cache: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, Any]:
        """Run the body on new slots after those in `cache` (None: a fresh window); returns `(hidden, cache)`.

        `mask` covers every slot of the window so far (cached and new); `position_ids` only the new slots.
        """
        self.check_mask(mask)
        out = self.body_module(
            inputs_embeds=inputs_embeds, attention_mask=mask, position_ids=position_ids, past_key_values=cache,
            use_cache=True, **kwargs,
        )
        return out.last_hidden_state, out.past_key_values

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the LM head (and the family's logit transform, if any)."""
        logits = self.model.get_output_embeddings()(hidden)
        cap = getattr(self.config, "final_logit_softcapping", None)
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def rotary(self, position_ids: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(cos, sin)` `[B, T, Dh]` of the backbone's RoPE at `position_ids`; None for families without RoPE."""
        rope = getattr(self.body_module, "rotary_emb", None)
        if rope is None:
            return None
        return rope(like, position_ids=position_ids)


    # ---- per-layer attention access (attention-level methods) -----------------------------------------------

    @property
    def decoder_layers(self) -> list[nn.Module]:
        """The decoder layers, in order."""
        raise NotImplementedError(f"'{self.model_type}' exposes no decoder layers to hmt-adapters.")

    def _split_heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], heads, self.head_dim).transpose(1, 2)  # [B, T, H*D] -> [B, H, T, D]

    def attention_input(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """What layer `layer`'s attention projections read, given the layer's input `hidden` `[B, T, d_model]`."""
        raise NotImplementedError

    def layer_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-RoPE keys and values `[B, Hkv, T, D]` that layer `layer` computes from its input `hidden`."""
        raise NotImplementedError

    def layer_query(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(W_q [Hq*D, d_model], b_q or None, weight of the norm before attention or None)` of layer `layer`."""
        raise NotImplementedError


class RecurrentAdapter(BackboneAdapter):
    """Families without attention (state-space / RNN): memory can only enter through input embeddings."""

    family = "recurrent"
    has_attention = False
    takes_position_ids = False

    @property
    def max_positions(self) -> int | None:
        return None
