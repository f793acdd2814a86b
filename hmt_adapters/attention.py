"""Attention-level memory injection through transformers' attention interface (no forked modeling files).

`use_memory_attention(model)` registers `memory_attention` under `hmt_memory_<impl>` (with the mask function of
`<impl>`) and switches the backbone to it. Without a memory context the function is exactly the user's chosen
implementation; with one (`memory_context=AttentionContext(...)` passed to the backbone call) it records each
layer's pre-RoPE keys and values for the method's writer, and lets the layer's `MemoryRead` add memory K/V.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PREFIX = "hmt_memory_"
MEMORY_KWARG = "memory_context"  # keyword that carries attention-level memory to the patched attention function
# Keywords a family's attention may hand its kernel that memory reads honour: the window's positions and cache flags
# (the window's own mask already holds a sliding window), Gemma2's logit soft-cap and GPT-OSS's sink logits
# (`memory.attend.family_softcap`, `family_sink_logits`). Any other keyword could change the family's softmax where
# memory computes its own, so a family whose attention hands one is refused at wrap time (`BackboneAdapter`).
KERNEL_KWARGS = frozenset(
    {"position_ids", "cache_position", "use_cache", "output_attentions", "sliding_window", "softcap", "s_aux"}
)

# (position_ids, like, layer) -> (cos, sin) or, for a family rotating its own way, (cos, sin, its RoPE function)
Rotary = Callable[..., "tuple | None"]


# ---- RoPE helpers ---------------------------------------------------------------------------------------------


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


# (x [B, H, T, D], cos, sin broadcastable to [B, H, T, Dc]) -> x rotated: a family's own RoPE (`family.own_rope`)
RopeFunction = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def apply_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, family_rope: RopeFunction | None = None
) -> torch.Tensor:
    """RoPE of `x` `[..., D]` by `cos, sin` broadcastable to `[..., Dr]`; `Dr < D` rotates the first `Dr` dims only
    (partial rotary: Phi, StableLM, GPT-NeoX), as the families themselves do. `family_rope` is the family's own
    function where it rotates differently from Llama's half split (interleaved pairs: Cohere, GLM, GPT-J;
    docs/architecture.md)."""
    if family_rope is not None:
        return family_rope(x, cos, sin)
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)
    return x * cos + rotate_half(x) * sin


def rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, family_rope: RopeFunction | None = None
) -> torch.Tensor:
    """RoPE rotation of `x` `[B, H, T, D]` by `cos, sin` `[B, T, Dr]` (the backbone's own convention)."""
    return apply_rope(x, cos[:, None], sin[:, None], family_rope)


def unrotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, family_rope: RopeFunction | None = None
) -> torch.Tensor:
    """Exact inverse of `rotate`: the pre-RoPE tensor (also for RoPE scaled by an attention factor, as YaRN's).

    Every RoPE here is `x * g(cos) + pair(x) * g(sin)` with `g` a selection of entries and `pair` a quarter turn of
    each dimension pair, so the rotation by `(cos, -sin) / (cos^2 + sin^2)` undoes it."""
    cos, sin = cos[:, None], sin[:, None]
    norm = cos * cos + sin * sin
    return apply_rope(x, cos / norm, -sin / norm, family_rope)


# ---- masks ----------------------------------------------------------------------------------------------------


def local_visibility(
    attention_mask: torch.Tensor | None, q_len: int, k_len: int, device: torch.device
) -> torch.Tensor:
    """The layer's own mask as bool `[B|1, 1, q, k]` (True = visible); None means causal, aligned bottom-right."""
    if attention_mask is None:
        q = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
        return (torch.arange(k_len, device=device)[None, :] <= q)[None, None]
    if attention_mask.dtype == torch.bool:
        return attention_mask
    return attention_mask == 0  # additive float mask: 0 = visible


def delegate_mask(visible: torch.Tensor, impl: str, dtype: torch.dtype) -> torch.Tensor:
    """A bool visibility mask in the format the delegate implementation expects."""
    if impl == "eager":
        return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
            ~visible, torch.finfo(dtype).min
        )
    return visible


# ---- registration ---------------------------------------------------------------------------------------------


def delegate_of(module: Any) -> str:
    """The implementation the memory function wraps for `module` (`sdpa`, `eager`, ...)."""
    impl = module.config._attn_implementation
    return impl[len(PREFIX) :] if impl.startswith(PREFIX) else impl


def delegate_function(module: nn.Module, impl: str) -> Callable:
    if impl == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward  # the family's own eager attention
    return ALL_ATTENTION_FUNCTIONS[impl]


def use_memory_attention(causal_lm: Any) -> str:
    """Switch `causal_lm` to the memory attention wrapping its current implementation; returns the new name."""
    current = causal_lm.config._attn_implementation or "eager"
    if current.startswith(PREFIX):
        return current
    name = PREFIX + current
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, memory_attention)
        mask_fn = ALL_MASK_ATTENTION_FUNCTIONS.get(current, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
        AttentionMaskInterface.register(name, mask_fn)
    causal_lm.set_attn_implementation(name)
    return name


def memory_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The registered attention function: the user's implementation, plus memory where a context says so."""
    context = kwargs.pop(MEMORY_KWARG, None)
    impl = delegate_of(module)
    delegate = delegate_function(module, impl)
    if context is None:
        return delegate(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    call = AttentionCall(module, query, key, value, attention_mask, scaling, dropout, kwargs, impl, delegate)
    return context.attend(call)


def _rope_type(module: nn.Module, layer: int) -> tuple[str | None, bool]:
    """The RoPE a layer uses: its `config.layer_types` entry where a family keeps one RoPE per type (Gemma3), and
    whether it rotates at all."""
    types = getattr(getattr(module, "config", None), "layer_types", None)
    return (types[layer] if types else None, bool(getattr(module, "use_rope", True)))  # SmolLM3: NoPE layers


# ---- per call -------------------------------------------------------------------------------------------------


@dataclass
class AttentionCall:
    """Everything one layer's attention call received, with helpers to run it with extra memory K/V."""

    module: Any  # the family's attention module (its `layer_idx`, `config`, ... vary by family)
    query: torch.Tensor  # [B, Hq, q, D] (post-RoPE)
    key: torch.Tensor  # [B, Hkv, k, D] (post-RoPE, cache included)
    value: torch.Tensor  # [B, Hkv, k, D]
    attention_mask: torch.Tensor | None
    scaling: float | None
    dropout: float
    kwargs: dict[str, Any]
    impl: str
    delegate: Callable

    @property
    def layer(self) -> int:
        return self.module.layer_idx

    def run(
        self, key: torch.Tensor | None = None, value: torch.Tensor | None = None, visible: torch.Tensor | None = None
    ):
        """The delegate on (possibly extended) K/V; `visible` is a bool mask over all keys."""
        mask = self.attention_mask if visible is None else delegate_mask(visible, self.impl, self.query.dtype)
        impl_fn = self.delegate
        if visible is not None and self.impl not in ("sdpa", "eager"):
            impl_fn = ALL_ATTENTION_FUNCTIONS["sdpa"]  # kernels without arbitrary masks fall back to sdpa with memory
        return impl_fn(
            self.module,
            self.query,
            self.key if key is None else key,
            self.value if value is None else value,
            mask,
            scaling=self.scaling,
            dropout=self.dropout,
            **self.kwargs,
        )

    def run_with_prefix(self, mem_k: torch.Tensor, mem_v: torch.Tensor, mem_visible: torch.Tensor | None = None):
        """Attention over `[memory ; local]` in one joint softmax; memory K/V `[B, Hkv, S, D]` already rotated.

        `mem_visible` `[B, 1|Hq, q, S]` bool restricts which memory entries each query sees (default: all).
        """
        q_len = self.query.shape[2]
        local = local_visibility(self.attention_mask, q_len, self.key.shape[2], self.query.device)
        B, S = self.query.shape[0], mem_k.shape[2]
        if mem_visible is None:
            mem_visible = torch.ones(B, 1, q_len, S, dtype=torch.bool, device=self.query.device)
        heads = max(local.shape[1], mem_visible.shape[1])
        local = local.expand(B, heads, q_len, local.shape[-1])
        mem_visible = mem_visible.expand(B, heads, q_len, S)
        visible = torch.cat([mem_visible, local], dim=-1)
        key = torch.cat([mem_k.to(self.key.dtype), self.key], dim=2)
        value = torch.cat([mem_v.to(self.value.dtype), self.value], dim=2)
        return self.run(key, value, visible)


@dataclass
class AttentionContext:
    """Per backbone call: what each memory layer reads, and the K/V each recorded layer saw.

    `reads[i](call, context)` returns the layer's attention output; `records[i]` is `(pre-RoPE keys, values)` of
    the tokens of this call, `[B, Hkv, q, D]` each, for layers in `record_layers`. With `rotated_records` set
    (decoding, one token a call), `records[i]` is `(post-RoPE keys, values, the call's RoPE)` instead, and
    `unrotate_records` undoes RoPE once for all the steps of a segment: undoing it per token and layer cost more
    than the decoded token's attention (docs/cost.md, decode).
    """

    reads: dict[int, Callable[[AttentionCall, AttentionContext], Any]] = field(default_factory=dict)
    record_layers: frozenset[int] = frozenset()
    rotary: Rotary | None = None  # (position_ids, like, layer) -> (cos, sin); None for families without RoPE
    records: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    rotated_records: bool = False
    calls: int = 0
    layer: int | None = None  # the layer whose attention runs now (RoPE can differ per layer type)
    notes: dict[int | str, Any] = field(default_factory=dict)  # what a method's read hands to its update (per layer)
    # The position tensor the cache was computed for, held (not its `id`: a freed tensor's id is reused by the next
    # one, which returned the previous decoding step's angles) with its in-place version counter.
    _rope_for: tuple[torch.Tensor, int] | None = None
    _rope_cache: dict = field(default_factory=dict)

    def rope_at(self, position_ids: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`(cos, sin)` of the current layer at `position_ids` `[B, T]` (any integers, negatives included), or None
        without RoPE."""
        if self.rotary is None:
            return None
        return self.rotary(position_ids, like, self.layer)

    def rotate_at(self, k: torch.Tensor, positions: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
        """`k` `[B, H, S, D]` rotated at `positions` `[B, S]` or per head `[B, H, S]` (unchanged without RoPE or
        with `positions=None`, a read at position 0)."""
        if positions is None:
            return k
        rope = self.rope_at(positions.reshape(positions.shape[0], -1), like)
        if rope is None:
            return k
        cos, sin = (t.view(*positions.shape, t.shape[-1]) for t in rope[:2])
        if positions.dim() == 2:
            cos, sin = cos[:, None], sin[:, None]
        return apply_rope(k, cos, sin, *rope[2:])  # rope[2]: the family's own RoPE function, if it has one

    def call_rope(self, call: AttentionCall) -> tuple[Any, ...] | None:
        """`(cos, sin)` of this call's query positions (computed once per backbone call and RoPE type)."""
        if self.rotary is None:
            return None
        position_ids = call.kwargs.get("position_ids")
        if position_ids is None:
            probe = torch.zeros(1, 1, dtype=torch.long, device=call.query.device)
            if self.rotary(probe, call.query, call.layer) is None:
                return None  # no RoPE: nothing to undo
            raise NotImplementedError(
                f"{type(call.module).__name__} does not pass `position_ids` to its attention function, so the "
                "positions of its RoPE keys cannot be undone for memory."
            )
        if (
            self._rope_for is None
            or self._rope_for[0] is not position_ids
            or self._rope_for[1] != position_ids._version
        ):
            self._rope_for, self._rope_cache = (position_ids, position_ids._version), {}
        kind = _rope_type(call.module, call.layer)
        if kind not in self._rope_cache:
            self._rope_cache[kind] = self.rotary(position_ids, call.query, call.layer)
        return self._rope_cache[kind]

    def pre_rope(self, call: AttentionCall, x: torch.Tensor) -> torch.Tensor:
        """The un-rotated version of this call's newest `x` rows (keys or queries)."""
        rope = self.call_rope(call)
        if rope is None:
            return x
        cos, sin, *family_rope = rope
        return unrotate(x, cos[:, -x.shape[2] :], sin[:, -x.shape[2] :], *family_rope)

    def attend(self, call: AttentionCall):
        self.calls += 1
        layer = self.layer = call.layer
        if layer in self.record_layers:
            q_len = call.query.shape[2]
            k, v = call.key[:, :, -q_len:], call.value[:, :, -q_len:]
            if self.rotated_records:
                self.records[layer] = (k, v, self.call_rope(call))  # type: ignore[assignment]
            else:
                self.records[layer] = (self.pre_rope(call, k), v)
        read = self.reads.get(layer)
        if read is None:
            return call.run()
        return read(call, self)


def unrotate_records(steps: list[dict[int, tuple]]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """`(pre-RoPE keys, values)` per layer, `[B, Hkv, n, D]`, from the `rotated_records` of consecutive calls
    (`(post-RoPE keys, values, RoPE of the call)` each), RoPE undone once per layer."""
    out = {}
    for layer in steps[0] if steps else ():
        parts = [step[layer] for step in steps]
        keys = torch.cat([k for k, _, _ in parts], 2)
        values = torch.cat([v for _, v, _ in parts], 2)
        if parts[0][2] is not None:
            cos = torch.cat([rope[0][:, -k.shape[2] :] for k, _, rope in parts], 1)
            sin = torch.cat([rope[1][:, -k.shape[2] :] for k, _, rope in parts], 1)
            keys = unrotate(keys, cos, sin, *parts[0][2][2:])
        out[layer] = (keys, values)
    return out
