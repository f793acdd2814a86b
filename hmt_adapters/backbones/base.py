"""`BackboneAdapter`: what the runtime needs from a causal LM, found through transformers' own structure.

Embeddings and the LM head come from `get_input_embeddings`/`get_output_embeddings`, the body from `base_model`, the
decoder layers from the body's layer list, per-layer keys/values and RoPE from the family's own modules (captured
inside the registered attention function). What a family does differently lives in `family.py`, one named entry
per difference; family files subclass the adapter only for what no structure reveals (SSM state, RWKV masks).
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch
from torch import nn

from ..attention import KERNEL_KWARGS, MEMORY_KWARG, rotate, unrotate, use_memory_attention
from ..compat import cache_kwargs, output_cache
from . import family as fam

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def unwrap_causal_lm(model: nn.Module) -> nn.Module:
    """The `*ForCausalLM` module inside `model` (a peft `PeftModel` is unwrapped, its LoRA layers stay in place)."""
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base) and type(model).__name__.startswith("Peft"):
        return get_base()
    return model


def positions_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: cumulative count of real slots minus one, clamped at 0."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


class _Captured(Exception):
    """Raised inside a layer's attention once its keys and values are recorded (the rest of the layer is not run)."""

    def __init__(self, key: torch.Tensor, value: torch.Tensor, query: torch.Tensor):
        super().__init__("captured")
        self.key, self.value, self.query = key, value, query


class _CaptureKV:
    """An attention context (duck-typed for `memory_attention`) that records the layer's K/V and stops the layer."""

    def attend(self, call: Any) -> Any:
        raise _Captured(call.key, call.value, call.query)


class _CountLayers:
    """An attention context that runs each layer unchanged and notes which layers it reached and the keywords their
    attention handed its kernel."""

    def __init__(self) -> None:
        self.layers: set[int] = set()
        self.positioned: set[int] = set()  # layers whose attention was handed `position_ids`
        self.kwargs: set[str] = set()

    def attend(self, call: Any) -> Any:
        self.layers.add(call.layer)
        if call.kwargs.get("position_ids") is not None:
            self.positioned.add(call.layer)
        self.kwargs.update(call.kwargs)
        return call.run()


class BackboneAdapter:
    """Uniform access to a HF causal LM: embeddings, the body up to the LM-head input, logits and sizes."""

    model_types: ClassVar[tuple[str, ...]] = ()
    family: ClassVar[str] = "decoder"
    takes_position_ids: ClassVar[bool] = True

    def __init__(self, model: nn.Module):
        self.model = cast("PreTrainedModel", unwrap_causal_lm(model))
        self.config: Any = self.model.config  # per-family fields (num_hidden_layers, ...), not in the base class
        # what the last wrap-time probe saw (`_layers_without_memory`): the keywords the attention handed its kernel,
        # and the RoPE layers whose attention got no `position_ids`
        self._kernel_kwargs: set[str] = set()
        self._unpositioned: list[int] = []
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
        return self._embedding_weight.shape[-1]

    @property
    def vocab_size(self) -> int:
        return self._embedding_weight.shape[0]

    def facts(self) -> dict[str, Any]:
        """What an adapter or a memory state depends on in this base model: architecture, widths, depth and
        vocabulary (saved with an adapter and checked against the base it is loaded onto)."""
        return {
            "base_model_architecture": type(self.model).__name__,
            "base_model_type": self.model_type,
            "embed_dim": self.embed_dim,
            "hidden_size": getattr(self.config, "hidden_size", None),
            "num_hidden_layers": getattr(self.config, "num_hidden_layers", None),
            "vocab_size": self.vocab_size,
        }

    @property
    def _embedding_weight(self) -> torch.Tensor:
        return cast(torch.Tensor, self.model.get_input_embeddings().weight)

    @property
    def max_positions(self) -> int | None:
        """Largest window the position scheme supports (None: no limit)."""
        return getattr(self.config, "max_position_embeddings", None)

    def embedding_std(self) -> float:
        return float(self._embedding_weight.detach().float().std())

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.config.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return fam.kv_heads(self.config) or self.num_heads

    @property
    def head_dim(self) -> int:
        return getattr(self.config, "head_dim", None) or self.config.hidden_size // self.num_heads

    @property
    def body_module(self) -> nn.Module:
        """The decoder the LM head reads: `base_model`, or `.model` where the class's `base_model_prefix` names an
        attribute it lacks (Llama 4's text-only class keeps the multimodal prefix "language_model")."""
        body = self.model.base_model
        return self.model.model if body is self.model and hasattr(self.model, "model") else body

    # ---- compute ---------------------------------------------------------------------------------------------

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings `[B, T] -> [B, T, d]`, as the body gets them from `input_ids` (family scaling included)."""
        return fam.scale_input_embeddings(self.body_module, self.model.get_input_embeddings()(input_ids))

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
        self,
        inputs_embeds: torch.Tensor,
        mask: torch.Tensor,
        position_ids: torch.Tensor | None,
        cache: Any,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, Any]:
        """Run the body on new slots after those in `cache` (None: a fresh window); returns `(hidden, cache)`.

        `mask` covers every slot of the window so far (cached and new); `position_ids` only the new slots.
        """
        self.check_mask(mask)
        out = self.body_module(
            inputs_embeds=inputs_embeds,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            **cache_kwargs(cache),
            **kwargs,
        )
        return out.last_hidden_state, output_cache(out)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Apply the LM head and the family's own logit transform (scaling, soft-capping; see `family.py`)."""
        head = self.model.get_output_embeddings()
        return fam.transform_logits(self.model, head(hidden.to(head.weight.dtype)))  # Mamba2's body ends in fp32

    # ---- attention structure (attention-level methods) -------------------------------------------------------

    @functools.cached_property
    def _layers(self) -> nn.ModuleList | None:
        return fam.find_layers(self.body_module, self.num_layers)

    @property
    def decoder_layers(self) -> list[Any]:
        """The decoder layers, in order: the body's module list with one entry per hidden layer."""
        if self._layers is None:
            raise NotImplementedError(
                f"'{self.model_type}': no list of {self.num_layers} decoder layers found in its body."
            )
        return list(self._layers)

    @functools.cached_property
    def _layers_sharing_kv(self) -> frozenset[int]:
        """The layers whose call takes `shared_kv_states`, where they keep keys and values for later layers (Gemma 4);
        found once, not per `layer_kv` call (MELODI calls it every segment)."""
        return frozenset(
            i
            for i, layer in enumerate(self.decoder_layers)
            if "shared_kv_states" in inspect.signature(layer.forward).parameters
        )

    @functools.cached_property
    def _family_rope(self) -> fam.RopeFunction | None:
        """The family's own RoPE function where it is not Llama's half split (`family.own_rope`)."""
        return fam.own_rope(self.attention_module(self.attention_layers[0]))

    def attention_module(self, layer: int) -> Any:
        """Layer `layer`'s self-attention module (None for a layer without one, e.g. an SSM layer of a hybrid)."""
        return fam.find_attention(self.decoder_layers[layer])

    def attention_refusal(self) -> str | None:
        """Why attention-level memory cannot be defined on this backbone (None: it can)."""
        try:
            layers = self.decoder_layers
        except NotImplementedError as err:
            return str(err)
        attns = [a for a in map(fam.find_attention, layers) if a is not None]
        nested = next(filter(None, map(fam.nested_attention, layers)), None)
        if not attns and nested is not None:
            return (
                f"its attention is not a module of its decoder layers but sits inside a block they call "
                f"(`{nested}`, shared between layers), where per-layer memory cannot be joined"
            )
        if not attns:
            return "it has no attention layers (memory can only enter through input embeddings)"
        if any(getattr(a, "is_kv_shared_layer", False) for a in attns):  # Gemma 3n, Gemma 4
            return "its later layers reuse the keys and values of earlier ones, which per-layer memory does not follow"
        return fam.attention_refusal(self.model, attns[0], self.rope_module)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of the layers with self-attention (all of them but in hybrids such as Jamba, Bamba, LFM2)."""
        return tuple(i for i, layer in enumerate(self.decoder_layers) if fam.find_attention(layer) is not None)

    def check_memory_layers(self, field: str, layers: tuple[int, ...]) -> None:
        """Raise `ValueError` naming `field` when memory is asked of layers without attention (hybrids)."""
        allowed = self.attention_layers
        bad = sorted(set(layers) - set(allowed))
        if bad:
            raise ValueError(
                f"{field} must name attention layers of this hybrid '{self.model_type}' backbone, {list(allowed)}; "
                f"got {bad}, which have no attention (pass the layers explicitly, e.g. "
                f"{field.split('`')[1]}={list(allowed)})."
            )

    def _memory_kwarg_refusal(self) -> str | None:
        previous = self.config._attn_implementation
        use_memory_attention(self.model)
        missing = self._layers_without_memory()
        if missing:  # layers that drop keyword arguments (StableLM): bridge the memory keyword by hooks, probe again
            for i in missing:
                fam.bridge_memory_kwarg(self.decoder_layers[i], self.attention_module(i), MEMORY_KWARG)
            missing = self._layers_without_memory()
        if missing:  # a body that does not pass them to its layers either (Falcon, transformers >= 5.25)
            for i in missing:
                fam.pass_memory_kwarg(self.body_module, self.decoder_layers[i], MEMORY_KWARG)
            missing = self._layers_without_memory()
        if not missing and self._unpositioned:  # layers that keep `position_ids` from their attention (Llama 4)
            for i in self._unpositioned:
                fam.bridge_memory_kwarg(self.decoder_layers[i], self.attention_module(i), "position_ids")
            missing = self._layers_without_memory()
        unknown = sorted(self._kernel_kwargs - KERNEL_KWARGS)
        if not missing and not unknown and not self._unpositioned:
            return None
        self.model.set_attn_implementation(previous)
        if missing:
            return f"the memory does not reach the attention of its layers {missing}"
        if self._unpositioned:
            return (
                f"its layers {self._unpositioned} do not hand `position_ids` to their attention, where memory "
                "re-positions its RoPE keys"
            )
        return (
            f"its attention hands its kernel {unknown}, which memory reads do not apply where they compute their own "
            f"softmax (those they do: {sorted(KERNEL_KWARGS)})"
        )

    def _layers_without_memory(self) -> list[int]:
        """The attention layers whose attention function a 2-token probe through the body finds no memory in (the
        keywords those it reached handed their kernel: `_kernel_kwargs`)."""
        probe = _CountLayers()
        ids = torch.zeros(1, 2, dtype=torch.long, device=next(self.model.parameters()).device)
        with torch.no_grad():
            self.body(self.embed(ids), torch.ones_like(ids), **{MEMORY_KWARG: probe})
        self._kernel_kwargs = probe.kwargs
        rotated = {i for i in probe.layers if self.rope_module is not None and fam.uses_rope(self.attention_module(i))}
        self._unpositioned = sorted(rotated - probe.positioned)
        return sorted(set(self.attention_layers) - probe.layers)

    @property
    def supports_attention_memory(self) -> bool:
        return self.attention_refusal() is None

    def check_attention_memory(self, method: str, alternatives: list[str]) -> None:
        """Raise `NotImplementedError` naming `method`, the family and the reason when attention memory is undefined.

        Besides the structural checks, one 2-token probe through the memory attention checks that the memory context
        reaches every layer's attention function (a family whose layers drop keyword arguments would lose memory
        silently).
        """
        previous = self.config._attn_implementation
        reason = self.attention_refusal() or self._memory_kwarg_refusal() or self._key_position_refusal()
        if reason is not None and self.config._attn_implementation != previous:
            self.model.set_attn_implementation(previous)  # a refused backbone is left as the user gave it
        if reason is not None:
            raise NotImplementedError(
                f"'{method}' injects memory into attention layers, which '{self.model_type}' "
                f"({type(self.model).__name__}) does not support: {reason}. Methods that work on it: {alternatives}."
            )

    # ---- RoPE ------------------------------------------------------------------------------------------------

    @property
    def rope_module(self) -> Any:
        return getattr(self.body_module, "rotary_emb", None)

    def _position_embeddings(self, position_ids: torch.Tensor, like: torch.Tensor, layer: int | None) -> Any:
        """What the body's rotary module hands layer `layer` at `position_ids` (the family's own form)."""
        rope = self.rope_module
        if "layer_type" in inspect.signature(rope.forward).parameters:
            return rope(like, position_ids, fam.layer_type(self.config, 0 if layer is None else layer))
        return rope(like, position_ids=position_ids)

    def _rope_pair(self, position_ids: torch.Tensor, like: torch.Tensor, layer: int | None) -> tuple:
        """`_position_embeddings` as a pair in the family's order: `(cos, sin)`, `(sin, cos)`, or the real and
        imaginary parts of complex frequencies `cos + i sin` (Llama 4's `freqs_cis`)."""
        emb = self._position_embeddings(position_ids, like, layer)
        return (emb.real, emb.imag) if isinstance(emb, torch.Tensor) and emb.is_complex() else tuple(emb)

    @property
    def _rope_probe(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(position_ids, like)` at positions 0, 3 and -3 for probing the rotary module."""
        first = next(self.model.parameters())
        probe = torch.zeros(1, 1, first.shape[-1], dtype=first.dtype, device=first.device)
        return torch.tensor([[0, 3, -3]], device=first.device), probe

    @functools.cached_property
    def _rope_form(self) -> tuple[bool, bool]:
        """`(sin first, negatives computed)`, by behaviour: the entry that is all zeros at position 0 is the sine
        (GPT-J and CodeGen hand `(sin, cos)`); a module that computes angles gives `(cos p, -sin p)` at `-p`, a table
        (GPT-J's) wraps negative indices around instead."""
        a, b = (t.float() for t in self._rope_pair(*self._rope_probe, None))
        sin_first = bool((a[:, 0] == 0).all() and not (b[:, 0] == 0).all())
        cos, sin = (b, a) if sin_first else (a, b)
        negatives = torch.allclose(cos[:, 2], cos[:, 1]) and torch.allclose(sin[:, 2], -sin[:, 1])
        return sin_first, negatives

    def rotary(
        self, position_ids: torch.Tensor, like: torch.Tensor, layer: int | None = None
    ) -> tuple[Any, ...] | None:
        """`(cos, sin)` `[B, T, Dr]` of the backbone's RoPE for layer `layer` at `position_ids`; None without RoPE.

        Any integer positions, negative ones included (memory keys sit before the window): where the rotary module
        is a table of positions (GPT-J), `-p` is `(cos p, -sin p)`. A family rotating its own way (interleaved pairs:
        Cohere, GLM, GPT-J; `family.own_rope`) adds its RoPE function as a third entry.

        `Dr` < head dim means partial rotary (the first `Dr` dims rotate). Families with one RoPE per layer type
        (Gemma3: local and global bases) get the layer's own; a layer without RoPE (SmolLM3's NoPE layers) gets None.
        """
        if self.rope_module is None or (layer is not None and not fam.uses_rope(self.attention_module(layer))):
            return None
        sin_first, negatives = self._rope_form
        sign = None
        if not negatives and bool((position_ids < 0).any()):
            sign, position_ids = torch.where(position_ids < 0, -1.0, 1.0), position_ids.abs()
        a, b = self._rope_pair(position_ids, like, layer)
        cos, sin = (b, a) if sin_first else (a, b)
        if sign is not None:
            sin = sin * sign[..., None].to(sin.dtype)
        return (cos, sin) if self._family_rope is None else (cos, sin, self._family_rope)

    # ---- per-layer attention access ----------------------------------------------------------------------------

    def layer_kv_shape(self, layer: int) -> tuple[int, int]:
        """`(key/value heads, head width)` of layer `layer`'s attention, where memory stores its keys and values: the
        family's sizes, or the layer's own where they differ by layer (Gemma 4's wider full-attention heads)."""
        attn = self.attention_module(layer)
        width = getattr(attn, "head_dim", None)
        groups = getattr(attn, "num_key_value_groups", None)
        heads = self.num_heads // groups if isinstance(groups, int) and groups > 0 else self.num_kv_heads
        return heads, width if isinstance(width, int) else self.head_dim

    def _captured_kv(
        self, layer: int, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[B, Hkv, T, D]` (keys rotated) that layer `layer`'s attention function receives when the
        decoder layer runs on `hidden` at `position_ids`. Needs the memory attention (`use_memory_attention`)."""
        module = self.decoder_layers[layer]
        capture = _CaptureKV()
        kwargs: dict[str, Any] = {"attention_mask": None, MEMORY_KWARG: capture}
        if self.rotary(position_ids, hidden, layer) is not None:
            kwargs["position_embeddings"] = self._position_embeddings(position_ids, hidden, layer)
        if self.takes_position_ids:
            kwargs["position_ids"] = position_ids
        if layer in self._layers_sharing_kv:
            kwargs["shared_kv_states"] = {}  # where a layer stores its keys for later layers (Gemma 4), none reuse
        try:
            with fam.kept_memory_kwarg(self.attention_module(layer), MEMORY_KWARG, capture):
                module.forward(hidden_states=hidden, **kwargs)  # not `module(...)`: its hooks see model calls only
        except _Captured as got:
            return got.key, got.value
        raise NotImplementedError(f"'{self.model_type}': layer {layer} ran without calling the memory attention.")

    def layer_kv(self, layer: int, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-RoPE keys and values `[B, Hkv, T, D]` that layer `layer` computes from its input `hidden`.

        Runs the decoder layer itself on `hidden` (at position 0, where RoPE is the identity up to its scale) and
        captures the keys/values its attention function receives: the family's own norms, projections, QK-norm and
        multipliers, with no re-implementation. Needs the memory attention (`use_memory_attention`) in place.
        """
        zeros = torch.zeros(hidden.shape[:2], dtype=torch.long, device=hidden.device)
        key, value = self._captured_kv(layer, hidden, zeros)
        rope = self.rotary(zeros, hidden, layer)
        return (key if rope is None else unrotate(key, *rope)), value

    def _key_position_refusal(self) -> str | None:
        """Why memory keys cannot be re-positioned exactly (None: they can), by behaviour, on every attention layer:
        keys and values must share the head width memory is stored at (not so under DeepSeek's multi-head latent
        attention), and the keys a layer computes at positions `p + 5` must be its keys at `p` rotated on by 5 with
        the RoPE `rotary` applies (not so with a norm after RoPE, as HunYuan's `key_layernorm` with trained weights).
        Needs the memory attention in place (`_memory_kwarg_refusal` ran)."""
        first = next(self.model.parameters())
        gen = torch.Generator().manual_seed(0)
        hidden = torch.randn(1, 6, self.config.hidden_size, generator=gen).to(first.device, first.dtype)
        here = torch.arange(6, device=first.device)[None]
        tolerance = max(16 * torch.finfo(first.dtype).eps, 1e-5)
        with torch.no_grad():
            for layer in self.attention_layers:
                key, value = self._captured_kv(layer, hidden, here)
                heads, width = self.layer_kv_shape(layer)
                if key.shape[1] != heads:
                    return f"its layer {layer}'s keys have {key.shape[1]} heads, not the {heads} memory stores"
                if key.shape[-1] != value.shape[-1] or key.shape[-1] != width:
                    return (
                        f"its keys ({key.shape[-1]} wide per head) and values ({value.shape[-1]} wide) do not "
                        f"share one head width (multi-head latent attention; head_dim {width}), which "
                        "memory stores both at"
                    )
                rope = self.rotary(here, hidden, layer)
                if rope is None:
                    continue
                moved, _ = self._captured_kv(layer, hidden, here + 5)
                expected = rotate(unrotate(key, *rope), *(self.rotary(here + 5, hidden, layer) or ())).float()
                if (expected - moved.float()).abs().max() > tolerance * moved.float().abs().max():
                    return (
                        f"its layer {layer}'s keys at other positions are not its RoPE rotation of the same "
                        "keys (a map after RoPE, such as a norm of the rotated keys), so memory keys cannot be "
                        "re-positioned"
                    )
        return None

    def layer_query(self, layer: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(W_q [Hq*D, d_model], b_q or None, weight of the norm before attention or None)` of layer `layer`."""
        block = self.decoder_layers[layer]
        found = fam.query_projection(fam.find_attention(block), self.num_heads, self.layer_kv_shape(layer)[1])
        if found is None:
            raise NotImplementedError(f"'{self.model_type}': no query projection found in layer {layer}'s attention.")
        norm = fam.attention_norm(block)
        return (*found, None if norm is None else getattr(norm, "weight", None))


class RecurrentAdapter(BackboneAdapter):
    """Families without attention (state-space / RNN): memory can only enter through input embeddings."""

    family = "recurrent"
    takes_position_ids = False

    @property
    def max_positions(self) -> int | None:
        return None

    def attention_refusal(self) -> str | None:
        return "it has no attention layers (memory can only enter through input embeddings)"
