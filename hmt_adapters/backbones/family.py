"""Where HF causal-LM families differ, each difference named once: the adapter asks these, never a family list.

Structure lookups (layer lists, attention modules, norms, projections) follow the names transformers uses; the
output path (logit scaling, soft-capping, multipliers) reads the model's own attributes and config fields.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..attention import RopeFunction, apply_rope

ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention")  # a decoder layer's self-attention
ATTENTION_NORM_NAMES = ("input_layernorm", "ln_1", "self_attn_layer_norm", "ln_attn", "operator_norm")
INTERFACE_NAME = "ALL_ATTENTION_FUNCTIONS"  # modeling modules that route attention through transformers' interface


# ---- output path --------------------------------------------------------------------------------------------


def scale_input_embeddings(body: Any, embeds: torch.Tensor) -> torch.Tensor:
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
    """Key/value heads (GQA/MQA) under the names families use: one for `multi_query` (GPT-BigCode; Falcon outside
    its new decoder architecture), else `num_key_value_heads`, else Falcon's `num_kv_heads`."""
    if getattr(config, "multi_query", False) and not getattr(config, "new_decoder_architecture", False):
        return 1
    named = getattr(config, "num_key_value_heads", None)
    if named:
        return named
    return getattr(config, "num_kv_heads", None)


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
    """The decoder layer's self-attention module, or None (an SSM / convolution layer of a hybrid). A hybrid whose
    layers hold one `mixer` of several kinds (Nemotron-H: Mamba2, attention or MLP) has attention where that mixer is
    an attention class."""
    found = first_submodule(layer, ATTENTION_NAMES)
    mixer = getattr(layer, "mixer", None)
    return found if found is not None or not type(mixer).__name__.endswith("Attention") else mixer


def nested_attention(layer: nn.Module) -> str | None:
    """Where a decoder layer without its own self-attention keeps one deeper down (Zamba2: a transformer block shared
    between its hybrid layers, `shared_transformer.self_attn`), or None."""
    for name, _ in layer.named_modules():
        if "." in name and name.rsplit(".", 1)[-1] in ATTENTION_NAMES:
            return name
    return None


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


def _qk_style(apply: Callable, narrow: bool) -> RopeFunction:
    """`apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)` as a function of one tensor `[B, H, T, D]` and `cos,
    sin` broadcastable to `[B, H, T, Dc]`. `narrow`: the first `Dc` dims go through it (Cohere, GLM, Helium, ERNIE
    4.5, ...); otherwise all `D` do, for a function that widens `cos, sin` itself (GPT-OSS: `Dc = D / 2`)."""

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        width = cos.shape[-1] if narrow else x.shape[-1]
        B, H, T = x.shape[:3]
        flat = x[..., :width].reshape(B * H, 1, T, width)
        cos, sin = (t.expand(B, H, T, t.shape[-1]).reshape(B * H, T, t.shape[-1]) for t in (cos, sin))
        rotated = apply(flat, flat, cos, sin)[1].reshape(B, H, T, width)
        return torch.cat([rotated, x[..., width:]], dim=-1)

    return rope


def _complex_style(apply: Callable) -> RopeFunction:
    """`apply_rotary_emb(xq [B, T, H, D], xk, freqs_cis [B, T, D / 2])` (Llama 4: interleaved pairs times complex
    frequencies `cos + i sin`) as a function of `[B, H, T, D]` and `cos, sin`."""

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, H, T, D = x.shape
        if x.numel() == 0:  # an empty part (no stored tail yet), which its reshape cannot take
            return x
        flat = x.reshape(B * H, T, 1, D)
        width = cos.shape[-1]
        freqs = torch.complex(*(t.float().expand(B, H, T, width).reshape(B * H, T, width) for t in (cos, sin)))
        return apply(flat, flat, freqs)[1].reshape(B, H, T, D)

    return rope


def _tensor_sin_cos_style(apply: Callable) -> RopeFunction:
    """`apply_rotary_pos_emb(tensor [B, T, H, D], sin, cos)` (GPT-J, CodeGen: interleaved pairs, `sin, cos` half the
    rotated width, the first `rotary_dim` dims rotated) as a function of `[B, H, T, D]` and `cos, sin`."""

    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = cos.shape[-1]
        B, H, T = x.shape[:3]
        flat = x[..., : 2 * half].reshape(B * H, T, 1, 2 * half)
        cos, sin = (t.expand(B, H, T, half).reshape(B * H, T, half) for t in (cos, sin))
        rotated = apply(flat, sin, cos).reshape(B, H, T, 2 * half)
        return torch.cat([rotated, x[..., 2 * half :]], dim=-1)

    return rope


def own_rope(attn: nn.Module | None) -> RopeFunction | None:
    """The family's own RoPE, `(x [B, H, T, D], cos, sin) -> x`, taken from its modeling module's
    `apply_rotary_pos_emb` where it rotates differently from Llama's half split (interleaved pairs as in Cohere, GLM,
    Helium, ERNIE 4.5, GPT-J, CodeGen; cos/sin narrowed inside it; cos/sin half the head wide, as GPT-OSS hands
    them; complex frequencies, Llama 4's `apply_rotary_emb`); None where it is the usual one or not found.

    Detected by behaviour: the candidate readings of the function rotate one random probe, the first that runs is
    compared with Llama's. Every such function is `x * g(cos) + pair(x) * g(sin)` with `g` a selection of entries,
    so `attention.unrotate` inverts it exactly; the adapter still checks at wrap time that keys re-rotated with it
    are the family's own (`BackboneAdapter`).
    """
    module = sys.modules.get(type(attn).__module__)
    apply = getattr(module, "apply_rotary_pos_emb", None) or getattr(module, "apply_rotary_emb", None)
    if not callable(apply):
        return None
    names = list(inspect.signature(apply).parameters)
    if names[:3] == ["tensor", "sin", "cos"]:
        candidates = [_tensor_sin_cos_style(apply)]
    elif names[:3] == ["xq", "xk", "freqs_cis"]:
        candidates = [_complex_style(apply)]
    elif names[:4] == ["q", "k", "cos", "sin"] or names == ["args", "kwargs"]:  # the `kernels` hub wrapper hides them
        candidates = [_qk_style(apply, narrow=True), _qk_style(apply, narrow=False)]
    else:
        return None
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 3, 16, generator=gen)
    cos, sin = torch.randn(2, 1, 1, 3, 8, generator=gen)
    for rope in candidates:
        try:
            theirs = rope(x, cos, sin)
        except (RuntimeError, TypeError, ValueError, IndexError):
            continue  # a reading that does not fit this function
        return None if torch.allclose(theirs, apply_rope(x, cos, sin)) else rope  # Llama's half split
    return None  # a form this wrapper does not know: the half split, checked at wrap time like every family


def linear_weights(layer: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
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


def query_projection(
    attn: nn.Module | None, heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """`(W_q [H*D, d], b_q)` of an attention module with a separate, gated or fused query projection (LoRA
    included)."""
    if attn is None:
        return None
    width = heads * head_dim
    q = linear_weights(getattr(attn, "q_proj", None))
    gated = q is not None and q[0].shape[0] == 2 * width  # Qwen3.5, Qwen3-Next: rows per head [q_h ; gate_h]
    if q is not None and gated:
        weight, bias = q
        w = weight.view(heads, 2, head_dim, -1)[:, 0].reshape(width, -1)
        return w, None if bias is None else bias.view(heads, 2, head_dim)[:, 0].reshape(width)
    if q is not None:
        return q
    fused = linear_weights(getattr(attn, "qkv_proj", None) or getattr(attn, "c_attn", None))  # Phi3; GPT-BigCode
    blocks = getattr(attn, "mp_num", None)  # CodeGen: rows per model-parallel block as [q_b ; v_b ; k_b]
    if fused is not None and isinstance(blocks, int) and fused[0].shape[0] == 3 * width:
        weight, bias = fused
        w = weight.view(blocks, 3, width // blocks, -1)[:, 0].reshape(width, -1)
        return w, None if bias is None else bias.view(blocks, 3, width // blocks)[:, 0].reshape(width)
    if fused is not None:  # [q ; k ; v] rows
        weight, bias = fused
        return weight[:width], None if bias is None else bias[:width]
    # GPT-NeoX, Falcon: rows per key/value group as [q_g1 .. q_gn ; k_g ; v_g] (GPT-NeoX and Falcon-7B's interleaved
    # heads are groups of one query, Falcon's multi-query one group of all)
    qkv = linear_weights(getattr(attn, "query_key_value", None))
    groups, extra = divmod(qkv[0].shape[0] // head_dim - heads, 2) if qkv is not None else (0, 1)
    if qkv is not None and not extra and groups > 0 and heads % groups == 0:
        weight, bias = qkv
        per = heads // groups
        w = weight.view(groups, per + 2, head_dim, -1)[:, :per].reshape(width, -1)
        b = None if bias is None else bias.view(groups, per + 2, head_dim)[:, :per].reshape(width)
        return w, b
    return None


# ---- attention-level memory ---------------------------------------------------------------------------------


def attention_refusal(causal_lm: nn.Module, attn: nn.Module, rope: nn.Module | None) -> str | None:
    """Why K/V memory cannot be injected into this family's attention (None: it can).

    Memory needs the attention to go through transformers' attention interface (where keys/values are read and
    memory joins them), and positions it can re-apply: RoPE (any pairing), or learned positions added to the input.
    ALiBi biases the logits inside the family's own attention by distance, which no memory
    key has.
    """
    module = sys.modules.get(type(attn).__module__)
    config = causal_lm.config
    alibi = getattr(config, "alibi", None)  # Falcon: a switch; Bloom: always (its attention takes `alibi`)
    if alibi or (alibi is None and "alibi" in inspect.signature(attn.forward).parameters):
        return (
            "its ALiBi attention biases logits by token distance inside its own attention code, which memory keys "
            "have none of"
        )
    if module is None or not hasattr(module, INTERFACE_NAME):
        return (
            "its attention does not go through transformers' attention interface, where memory keys/values are joined"
        )
    if rope is None and getattr(config, "rotary_dim", None):
        return "its RoPE is applied outside a rotary module that memory re-positioning can call"
    return None


def _kept(name: str) -> str:
    """The attribute a bridged module keeps keyword `name` of its caller's call in, to hand over."""
    return f"_hmt_kept_{name}"


def bridge_memory_kwarg(layer: nn.Module, attn: nn.Module, name: str) -> None:
    """Carry keyword `name` from a decoder layer's call into its attention's call, for layers that do not pass their
    keyword arguments on (StableLM: the memory keyword; Llama 4: `position_ids`): the layer's pre-hook keeps it, the
    attention's pre-hook hands it over. Hooks run again when a checkpointed layer is recomputed, so the memory
    follows."""
    if hasattr(attn, _kept(name)):
        return

    setattr(attn, _kept(name), None)
    layer.register_forward_pre_hook(_keep(attn, name), with_kwargs=True)
    attn.register_forward_pre_hook(_hand_over(name), with_kwargs=True)


def pass_memory_kwarg(body: nn.Module, layer: nn.Module, name: str) -> None:
    """Carry keyword `name` from the body's call into a decoder layer's call, for bodies that do not pass their
    keyword arguments on to their layers (Falcon from transformers 5.25): the body's pre-hook keeps it, the layer's
    pre-hook, put before the layer's other hooks (a method's, `bridge_memory_kwarg`'s), hands it over.

    A layer recomputed on its own (transformers' gradient checkpointing on the backbone) would be handed a later
    call's memory, so the layer's hook refuses that; this package's `gradient_checkpointing_enable()` recomputes whole
    segments, body call included, and the memory follows."""
    if hasattr(layer, _kept(name)):
        return

    hand_over = _hand_over(name)

    def checked_hand_over(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        handed = hand_over(module, args, kwargs)
        checkpointed = getattr(module, "gradient_checkpointing", False) and module.training
        if handed is not None and checkpointed and torch.is_grad_enabled():
            raise RuntimeError(
                f"{type(module).__name__} is checkpointed by transformers (`gradient_checkpointing_enable()` on the "
                "backbone), but its model body does not pass the memory on to its layers, so a recomputed layer "
                "would read a later segment's memory: turn it off on the backbone "
                "(`gradient_checkpointing_disable()`) and call `gradient_checkpointing_enable()` on the memory model, "
                "which recomputes whole segments."
            )
        return handed

    setattr(layer, _kept(name), None)
    body.register_forward_pre_hook(_keep(layer, name), with_kwargs=True)
    layer.register_forward_pre_hook(checked_hand_over, with_kwargs=True, prepend=True)


def _keep(owner: nn.Module, name: str) -> Callable[[nn.Module, tuple, dict], None]:
    """A pre-hook that keeps its call's keyword `name` (None for a call without it) on `owner`, to hand over."""

    def keep(module: nn.Module, args: tuple, kwargs: dict) -> None:
        setattr(owner, _kept(name), kwargs.get(name))

    return keep


def _hand_over(name: str) -> Callable[[nn.Module, tuple, dict], tuple[tuple, dict] | None]:
    """A pre-hook that adds keyword `name` with the value kept on its module to a call that lacks it."""

    def hand_over(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        value = getattr(module, _kept(name), None)
        if value is None or name in kwargs:
            return None
        return args, {**kwargs, name: value}

    return hand_over


@contextlib.contextmanager
def kept_memory_kwarg(attn: nn.Module | None, name: str, value: Any) -> Iterator[None]:
    """Inside, an attention module bridged for keyword `name` hands `value` over (for calls of the layer's `forward`
    without its hooks)."""
    if attn is None or not hasattr(attn, _kept(name)):
        yield
        return
    previous = getattr(attn, _kept(name))
    setattr(attn, _kept(name), value)
    try:
        yield
    finally:
        setattr(attn, _kept(name), previous)
