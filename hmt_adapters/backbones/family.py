"""Where HF causal-LM families differ, each difference named once: the adapter asks these, never a family list.

Structure lookups (layer lists, attention modules, norms, projections) follow the names transformers uses; the
output path (logit scaling, soft-capping, multipliers) reads the model's own attributes and config fields.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")  # a decoder layer's self-attention
ATTENTION_NORM_NAMES = ("input_layernorm", "ln_1", "self_attn_layer_norm", "ln_attn", "operator_norm")
INTERFACE_NAME = "ALL_ATTENTION_FUNCTIONS"  # modeling modules that route attention through transformers' interface


# ---- output path --------------------------------------------------------------------------------------------


def scale_input_embeddings(body: nn.Module, embeds: torch.Tensor) -> torch.Tensor:
    """Embeddings as the body computes them from `input_ids` when it scales them only on that path.

    Falcon-H1 multiplies `embed_tokens(input_ids)` by `embedding_multiplier` but takes `inputs_embeds` as given
    (Granite, Gemma scale inside the body on both paths: nothing to do).
    """
    if getattr(body.config, "model_type", "") == "falcon_h1":
        return embeds * body.embedding_multiplier
    return embeds


def transform_logits(causal_lm: nn.Module, logits: torch.Tensor) -> torch.Tensor:
    """The family's own map from LM-head output to logits, read from the model and its config."""
    config = causal_lm.config
    scale = getattr(causal_lm, "logit_scale", None)  # Cohere: logits * logit_scale
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        logits = logits * scale
    divisor = getattr(config, "logits_scaling", None)  # Granite: logits / logits_scaling
    if divisor:
        logits = logits / divisor
    multiplier = getattr(getattr(causal_lm, "model", None), "lm_head_multiplier", None)  # Falcon-H1
    if multiplier is not None:
        logits = logits * multiplier
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma2/3: cap * tanh(logits / cap)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


# ---- structure ----------------------------------------------------------------------------------------------


def kv_heads(config: Any) -> int | None:
    """Key/value heads (GQA/MQA) under the names families use."""
    if getattr(config, "multi_query", False):  # GPT-BigCode
        return 1
    return getattr(config, "num_key_value_heads", None) or getattr(config, "num_kv_heads", None)


def find_layers(body: nn.Module, count: int) -> nn.ModuleList | None:
    """The body's decoder layers: the first `ModuleList` of `count` entries, breadth first (`layers`, `h`,
    `decoder.layers`, `blocks`)."""
    queue = [body]
    while queue:
        module = queue.pop(0)
        for child in module.children():
            if isinstance(child, nn.ModuleList) and len(child) == count:
                return child
            queue.append(child)
    return None


def first_submodule(layer: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    """The first of `layer`'s attributes named in `names` that is a module, or None."""
    for name in names:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def find_attention(layer: nn.Module) -> nn.Module | None:
    """The decoder layer's self-attention module, or None (an SSM / convolution layer of a hybrid)."""
    return first_submodule(layer, ATTENTION_NAMES)


def attention_norm(layer: nn.Module) -> nn.Module | None:
    """The norm that feeds the layer's attention (None for post-norm layers such as OLMo2's)."""
    return first_submodule(layer, ATTENTION_NORM_NAMES)


def layer_type(config: Any, layer: int) -> str:
    """`config.layer_types[layer]` (e.g. Gemma3's "sliding_attention"/"full_attention"), for per-type RoPE."""
    types = getattr(config, "layer_types", None)
    return types[layer] if types else "full_attention"


def uses_rope(attn: nn.Module | None) -> bool:
    """Whether a layer's attention rotates its keys (SmolLM3 keeps NoPE layers: `use_rope` False)."""
    return bool(getattr(attn, "use_rope", True))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The half-split pairing (Llama's, and `attention.rotate_half`'s)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def pair_rotation(attn: nn.Module | None):
    """The family's own `rotate_half` where it pairs RoPE dimensions differently from the half-split one (Cohere:
    interleaved neighbours), taken from its modeling module; None for the usual pairing."""
    family_rotate = getattr(sys.modules.get(type(attn).__module__), "rotate_half", None)
    if family_rotate is None:
        return None
    probe = torch.arange(8.0)
    return None if torch.equal(family_rotate(probe), _rotate_half(probe)) else family_rotate


def linear_weights(layer: nn.Module | None) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """`(weight, bias)` a linear layer applies: a plain `nn.Linear`, or one peft wrapped with LoRA (its base weight
    plus the delta of every active, unmerged adapter, through peft's own `get_delta_weight`). None otherwise."""
    if isinstance(layer, nn.Linear):
        return layer.weight, layer.bias
    base = getattr(layer, "base_layer", None)
    if not isinstance(base, nn.Linear) or not hasattr(layer, "get_delta_weight"):
        return None
    weight = base.weight
    if not layer.merged and not layer.disable_adapters:
        for name in layer.active_adapters:
            if name in getattr(layer, "lora_A", {}):
                weight = weight + layer.get_delta_weight(name)
    return weight, base.bias


def query_projection(attn: nn.Module | None, heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """`(W_q [H*D, d], b_q)` of an attention module with a separate or a fused query projection (LoRA included)."""
    if attn is None:
        return None
    width = heads * head_dim
    q = linear_weights(getattr(attn, "q_proj", None))
    if q is not None:
        return q
    fused = linear_weights(getattr(attn, "qkv_proj", None) or getattr(attn, "c_attn", None))  # Phi3; GPT-BigCode
    if fused is not None:  # [q ; k ; v] rows
        weight, bias = fused
        return weight[:width], None if bias is None else bias[:width]
    qkv = linear_weights(getattr(attn, "query_key_value", None))  # GPT-NeoX: rows per head as [q_h ; k_h ; v_h]
    if qkv is not None and qkv[0].shape[0] == 3 * width:
        weight, bias = qkv
        w = weight.view(heads, 3, head_dim, -1)[:, 0].reshape(width, -1)
        b = None if bias is None else bias.view(heads, 3, head_dim)[:, 0].reshape(width)
        return w, b
    return None


# ---- attention-level memory ---------------------------------------------------------------------------------


def attention_refusal(causal_lm: nn.Module, attn: nn.Module, rope: nn.Module | None) -> str | None:
    """Why K/V memory cannot be injected into this family's attention (None: it can).

    Memory needs the attention to go through transformers' attention interface (where keys/values are read and
    memory joins them), and positions it can re-apply: RoPE (any pairing), or learned positions added to the input. ALiBi biases the logits inside the family's own attention by distance, which no memory
    key has.
    """
    module = sys.modules.get(type(attn).__module__)
    config = causal_lm.config
    alibi = getattr(config, "alibi", None)  # Falcon: a switch; Bloom: always (its attention takes `alibi`)
    if alibi or (alibi is None and "alibi" in inspect.signature(attn.forward).parameters):
        return "its ALiBi attention biases logits by token distance inside its own attention code, which memory keys have none of"
    if module is not None and hasattr(module, "rotate_every_two"):  # GPT-J, CodeGen (docs/architecture.md)
        return ("its RoPE rotates interleaved dimension pairs with (sin, cos) from its own rotary module, which "
                "memory keys are not re-positioned with")
    if module is None or not hasattr(module, INTERFACE_NAME):
        return "its attention does not go through transformers' attention interface, where memory keys/values are joined"
    if rope is None and getattr(config, "rotary_dim", None):
        return "its RoPE is applied outside a rotary module that memory re-positioning can call"
    return None


_KEPT = "_hmt_memory_kwarg"  # on an attention module: the memory keyword its decoder layer was called with


def bridge_memory_kwarg(layer: nn.Module, attn: nn.Module, name: str) -> None:
    """Carry keyword `name` from a decoder layer's call into its attention's call, for layers that do not pass their
    keyword arguments on (StableLM): the layer's pre-hook keeps it, the attention's pre-hook hands it over. Hooks run
    again when a checkpointed layer is recomputed, so the memory follows."""
    if hasattr(attn, _KEPT):
        return

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        setattr(attn, _KEPT, kwargs.get(name))

    def hand_over(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        value = getattr(module, _KEPT, None)
        if value is None or name in kwargs:
            return None
        return args, {**kwargs, name: value}

    setattr(attn, _KEPT, None)
    layer.register_forward_pre_hook(keep, with_kwargs=True)
    attn.register_forward_pre_hook(hand_over, with_kwargs=True)


@contextlib.contextmanager
def kept_memory_kwarg(attn: nn.Module | None, value: Any) -> Iterator[None]:
    """Inside, a bridged attention module hands `value` over (for calls of the layer's `forward` without its hooks)."""
    if attn is None or not hasattr(attn, _KEPT):
        yield
        return
    previous = getattr(attn, _KEPT)
    setattr(attn, _KEPT, value)
    try:
        yield
    finally:
        setattr(attn, _KEPT, previous)

