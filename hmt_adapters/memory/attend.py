"""Attention over `[memory ; local]` keys: UniMem's memory injection (Fang et al. 2024, its fourth dimension).

A reader hands the layer a `MemoryRead`: entries shared by all queries of the segment (`k`, `v`, `visible`) and,
for similarity reading, entries retrieved per query (`pq_*`). `attend_memory` runs them with the local keys in one
joint softmax: through the user's attention kernel when the read is a K/V prefix at key/value-head granularity,
through torch SDPA when the prefix has one entry set per query head (explicit matmuls if the user chose eager),
else through `joint_attention`; or, with a gate, mixes memory-only and local-only attention. Without gradients on
CPU, the per-query-head prefix and entries retrieved per query run through torch's flash kernel instead, the softmax
split into parts merged by their log-sum-exps (`prefix_attention`, `retrieved_attention`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..attention import AttentionCall, local_visibility


@dataclass
class MemoryRead:
    """What one memory layer's queries attend to besides their local keys, for one segment."""

    k: torch.Tensor  # [B, Hr, S, D] keys as the attention sees them (rotated), Hr = key/value or query heads
    v: torch.Tensor  # [B, Hr, S, D]
    visible: torch.Tensor  # [B, 1|Hr|Hq, 1|q, S] bool
    pq_logits: torch.Tensor | None = None  # [B, Hq, q, K] scaled logits of entries retrieved per query
    pq_v: torch.Tensor | None = None  # [B, Hq, q, K, D]
    pq_visible: torch.Tensor | None = None  # [B, Hq, q, K] bool
    decoding: DecodeKeys | None = None  # `[read ; window]` kept between decoded tokens (`decoded_token_attention`)


@dataclass
class DecodeKeys:
    """One layer's `[memory ; window]` keys and values while its segment is decoded token by token.

    The memory part is copied once; each decoding step appends the window's new entries, so torch SDPA reads one
    contiguous prefix of the buffers instead of the memory being concatenated to the window every token.
    """

    k: torch.Tensor  # [B, Hb, S + capacity, D], Hb = the read's heads (key/value or query heads)
    v: torch.Tensor
    visible: torch.Tensor | None  # [B, 1|Hq, 1, S + capacity] bool, or None while every entry is visible
    size: int  # memory entries S
    local: int = 0  # window entries held after the memory


QUERY_SLICE_FLOATS = 2**20  # fp32 logits per query slice (4 MiB): `query_slices`


def query_slices(q_len: int, per_query: int) -> list[slice]:
    """The queries in slices whose logits (`per_query` each, summed over batch and heads) stay under
    `QUERY_SLICE_FLOATS`. A segment's whole logit rectangle is tens of MB, mapped and zeroed anew on every call:
    on CPU those page faults cost as much as the matmul that fills it. A slice's buffer stays in cache and is reused
    by the allocator (docs/cost.md, "scored a slice of queries at a time")."""
    rows = max(1, QUERY_SLICE_FLOATS // max(per_query, 1))
    return [slice(first, min(q_len, first + rows)) for first in range(0, q_len, rows)]


def parts_attention(
    query: torch.Tensor,
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
    scaling: float,
) -> torch.Tensor:
    """Attention `[B, Hq, q, D]` of `query` over several key parts in one softmax, through torch's SDPA kernel:
    each part is keys, values `[B, Hkv, n, D]` (Hkv dividing Hq) and a visibility `[B|1, 1|Hq, 1|q, n]` (None:
    every query sees every key). The same numbers as one explicit fp32 softmax over the parts' logits (to the
    kernel's rounding), without writing them: on a CPU the fused kernel reads a 512-token chunk against a few
    thousand keys in two thirds of the time of sliced matmuls in fp32, half in bf16 (docs/cost.md, "One kernel for
    a joint softmax"). Hidden keys get the dtype's lowest value, not -inf, so a query that sees no key gets a
    uniform row, as the explicit softmax gives it (no NaN)."""
    keys = torch.cat([k for k, _, _ in parts], dim=2)
    values = torch.cat([v for _, v, _ in parts], dim=2)
    visible = joined_visibility([(m, k.shape[2]) for k, _, m in parts])
    additive = None if visible is None else additive_mask(visible, query.dtype)
    return F.scaled_dot_product_attention(
        query, keys, values, attn_mask=additive, scale=scaling, enable_gqa=keys.shape[1] != query.shape[1]
    )


def joined_visibility(parts: list[tuple[torch.Tensor | None, int]]) -> torch.Tensor | None:
    """The visibility `[B|1, 1|H, 1|q, n_1 + n_2 + ...]` of several key parts side by side: each part is its own
    (`[B|1, 1|H, 1|q, n]` bool, or None where every query sees its `n` keys) and `n`. None where no part has one."""
    masks = [m for m, _ in parts if m is not None]
    if not masks:
        return None
    shape = [max(m.shape[d] for m in masks) for d in range(3)]
    device = masks[0].device
    return torch.cat(
        [
            (m if m is not None else torch.ones(1, 1, 1, n, dtype=torch.bool, device=device)).expand(*shape, n)
            for m, n in parts
        ],
        dim=-1,
    )


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, hidden_value: float | None = None) -> torch.Tensor:
    """`visible` as an additive mask: 0 where visible, `hidden_value` elsewhere. By default the dtype's lowest value,
    not -inf, so a query that sees no key gets a uniform row (no NaN), as an explicit softmax over masked-filled
    logits gives it; -inf where hidden scores must stay -inf (the top-k reads: x + 0 = x and x + -inf = -inf exactly
    for any finite score, at a fraction of a broadcast `masked_fill_`'s cost on CPU, docs/cost.md)."""
    low = torch.finfo(dtype).min if hidden_value is None else hidden_value
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, low)


def expand_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Repeat dim 1 of `x` up to `heads` (query head h reads key/value head h // group, as HF's `repeat_kv`)."""
    if x.shape[1] in (1, heads):
        return x
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def _all_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """`x` `[B, 1|Hk, T, D]` with all `heads` materialised (MQA's single key/value head included)."""
    x = expand_heads(x, heads)
    return x.expand(x.shape[0], heads, *x.shape[2:])


def head_scores(query: torch.Tensor, key: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`query @ key^T` `[B, Hq, q, k]` for `key` `[B, Hk, k, D]` with `Hk` dividing `Hq` (query head h reads key
    head h // (Hq / Hk)), by grouping the queries instead of repeating the keys. `out`: where to write them, e.g. a
    column slice of a larger logit buffer (its rows may be strided, its last dimension not); same dtype as `query`.
    """
    batch, heads, q_len, dim = query.shape
    if key.shape[1] == heads:
        return torch.matmul(query, key.transpose(-1, -2), out=out)
    grouped = query.reshape(batch, key.shape[1], heads // key.shape[1] * q_len, dim)
    if out is not None:  # (heads, queries) merge into (key heads, group x queries) as a view of any row stride
        torch.matmul(grouped, key.transpose(-1, -2), out=out.view(*grouped.shape[:-1], key.shape[2]))
        return out
    return (grouped @ key.transpose(-1, -2)).view(batch, heads, q_len, key.shape[2])


def head_mix(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """`probs @ value` `[B, Hq, q, D]` for `value` `[B, Hk, k, D]` with `Hk` dividing `Hq`, without repeating it."""
    batch, heads, q_len, width = probs.shape
    if value.shape[1] == heads:
        return probs @ value
    grouped = probs.reshape(batch, value.shape[1], heads // value.shape[1] * q_len, width)
    return (grouped @ value).view(batch, heads, q_len, value.shape[-1])


# Kernels that ignore an attention logit soft-cap passed to them (transformers' sdpa function drops Gemma2's `softcap`;
# Gemma2 ran on sdpa before transformers 5.24 made it refuse sdpa): the memory path caps only where the layer's own
# kernel does, so memory joins the attention the backbone actually computes (docs/attention_memory.md).
KERNELS_WITHOUT_SOFTCAP = frozenset({"sdpa"})


def family_softcap(call: AttentionCall) -> float | None:
    """The attention logit soft-cap the layer's own kernel applies (Gemma2 under eager, flash or flex), or None."""
    return None if call.impl in KERNELS_WITHOUT_SOFTCAP else call.kwargs.get("softcap")


def family_sink_logits(call: AttentionCall) -> torch.Tensor | None:
    """The learned per-head sink logits `[Hq]` the layer's own kernel adds to its softmax (GPT-OSS's `s_aux`: one
    more logit per head, with no value), or None."""
    return call.kwargs.get("s_aux")


def attend_memory(call: AttentionCall, read: MemoryRead, gate: torch.Tensor | None = None):
    """The layer's attention output `([B, q, Hq, D], None)` with `read` joined to its local keys.

    `gate` (the memory weight alpha in [0, 1], broadcastable to `[B, Hq, q, 1]`) switches from the joint softmax to
    `alpha * Attn_mem + (1 - alpha) * Attn_local`. A family's sink logits (`family_sink_logits`) join the softmax as
    its own kernel adds them: through that kernel where memory is a prefix of its keys, else in `joint_attention`.
    """
    heads, q_len = call.query.shape[1], call.query.shape[2]
    shared_only = gate is None and read.pq_logits is None
    softcap = family_softcap(call)
    sink_logits = family_sink_logits(call)
    if shared_only and q_len == 1 and not softcap and not call.dropout and sink_logits is None:  # one decoded token
        scaling = call.scaling if call.scaling is not None else call.query.shape[-1] ** -0.5
        if call.impl == "eager":  # explicit, as the user's kernel
            local = local_visibility(call.attention_mask, q_len, call.key.shape[2], call.query.device)
            out = one_token_attention(call.query, call.key, call.value, local, read, scaling)
        else:
            out = decoded_token_attention(call.query, call.key, call.value, call.attention_mask, read, scaling)
        return out.transpose(1, 2).contiguous(), None
    if shared_only and read.k.shape[1] == call.key.shape[1]:
        return call.run_with_prefix(read.k, read.v, expand_heads(read.visible, heads))  # the user's kernel
    local = local_visibility(call.attention_mask, q_len, call.key.shape[2], call.query.device)
    scaling = call.scaling if call.scaling is not None else call.query.shape[-1] ** -0.5
    fused = call.impl != "eager" and q_len > 1 and not softcap and sink_logits is None
    fast: torch.Tensor | None = None
    if shared_only and fused:  # memory per query head (TRAMS under GQA)
        fast = prefix_attention(call.query, call.key, call.value, local, read, scaling, call.dropout)
    elif fused and gate is None and not call.dropout:  # retrieved per query, read without gradients (inference)
        fast = retrieved_attention(call.query, call.key, call.value, local, read, scaling)
    # eager, gated, soft-capped, one decoded token or training: explicit, only logits concatenated
    out = (
        fast
        if fast is not None
        else joint_attention(
            call.query, call.key, call.value, local, read, scaling, call.dropout, gate, softcap, sink_logits
        )
    )
    return out.transpose(1, 2).contiguous(), None


def prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    local_visible: torch.Tensor,
    read: MemoryRead,
    scaling: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """`[B, Hq, q, D]`: the softmax over `[read.k ; key]` with every part brought to the query heads, a query that
    sees nothing reading every key (padding must not give NaN). For inference on CPU (`inference_kernel`) the two
    parts run as two calls of the flash kernel merged by their log-sum-exps (`merge_by_lse`): the memory unmasked
    where every entry is visible and the segment with the kernel's own causal mask, instead of one masked call over
    a concatenated copy (the call alone: 1.2x at TRAMS' shape at segments of 128, 1.5x at 512; docs/cost.md). Else
    one SDPA call."""
    batch, heads, q_len, _ = query.shape
    size = read.k.shape[2]
    # [B, 1|Hq, 1|q, S], not widened over the queries: the kernel's mask broadcasts it (None: every entry visible)
    mem_visible = None if bool(read.visible.all()) else expand_heads(read.visible, heads)
    if not dropout and inference_kernel(query, key, value, read.k, read.v):
        local: torch.Tensor | None = local_visible
        if mem_visible is not None:
            blind = ~(mem_visible.any(-1, keepdim=True) | local_visible.any(-1, keepdim=True))
            if bool(blind.any()):  # nothing visible in either part: every key of both
                mem_visible, local = mem_visible | blind, local_visible | blind
        causal = q_len == key.shape[2] and bool(
            torch.equal(local_visible, local_visibility(None, q_len, q_len, query.device))
        )
        parts = [
            kernel_with_lse(query, read.k, read.v, mem_visible, scaling),
            kernel_with_lse(query, key, value, None if causal else local, scaling, causal=causal),
        ]
        return merge_by_lse(parts)
    if mem_visible is None:  # every entry visible to every query: one mask for all heads, the local one widened
        rows, local_heads = local_visible.shape[:2]
        local_all = local_visible.expand(rows, local_heads, q_len, key.shape[2])
        visible = torch.cat([local_all.new_ones(rows, local_heads, q_len, size), local_all], dim=-1)
    else:
        mem_all = mem_visible.expand(batch, heads, q_len, size)
        visible = torch.cat([mem_all, local_visible.expand(batch, heads, q_len, key.shape[2])], dim=-1)
        visible = visible | ~visible.any(-1, keepdim=True)
    keys = torch.cat([_all_heads(read.k, heads).to(query.dtype), _all_heads(key, heads)], dim=2)
    values = torch.cat([_all_heads(read.v, heads).to(query.dtype), _all_heads(value, heads)], dim=2)
    return F.scaled_dot_product_attention(query, keys, values, attn_mask=visible, dropout_p=dropout, scale=scaling)


# torch's CPU flash-attention kernel, which also returns each query's log-sum-exp (`kernel_with_lse`); absent from
# a torch without it
FLASH_WITH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def inference_kernel(query: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether `kernel_with_lse` can serve this call: torch's CPU kernel is there and no gradient is needed (its
    log-sum-exp has none, so training keeps one softmax over every part)."""
    if FLASH_WITH_LSE is None or query.device.type != "cpu":
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in (query, *tensors)))


def kernel_with_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor | None,
    scaling: float,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention `[B, Hq, q, D]` of `query` over one key part (`[B, 1|Hk, n, D]`, Hk dividing Hq; `visible`
    `[B|1, 1|Hq, 1|q, n]` bool or None) and each query's log-sum-exp `[B, Hq, q]` (fp32), by torch's CPU flash
    kernel (`inference_kernel`). A hidden key's logit is the dtype's lowest value (`additive_mask`): a query that
    sees nothing gets a finite log-sum-exp about that low, which weighs nothing in `merge_by_lse`."""
    assert FLASH_WITH_LSE is not None  # callers check `inference_kernel`
    batch, heads, q_len, _ = query.shape
    keys = _all_heads(key.to(query.dtype), heads).contiguous()  # the kernel takes every query head's keys
    values = _all_heads(value.to(query.dtype), heads).contiguous()
    bias = None if visible is None else additive_mask(visible, query.dtype)
    if bias is not None:
        bias = bias.expand(batch, bias.shape[1], q_len, keys.shape[2])
    return FLASH_WITH_LSE(query, keys, values, is_causal=causal, attn_mask=bias, scale=scaling)


def merge_by_lse(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """One softmax's output from the outputs `[B, H, q, D]` and log-sum-exps `[B, H, q]` of softmaxes over disjoint
    sets of its keys: each part weighs its share of the joint normaliser, `exp(lse_i) / sum_j exp(lse_j)`."""
    top = torch.stack([lse for _, lse in parts]).amax(0)
    weights = [(lse - top).exp() for _, lse in parts]
    total = torch.stack(weights).sum(0)
    out = None
    for (part, _), weight in zip(parts, weights):
        term = part * (weight / total)[..., None].to(part.dtype)
        out = term if out is None else out + term
    assert out is not None
    return out


def retrieved_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    local_visible: torch.Tensor,
    read: MemoryRead,
    scaling: float,
) -> torch.Tensor | None:
    """`[B, Hq, q, D]`: `joint_attention`'s softmax over `[retrieved per query ; shared memory ; local]` (no gate, no
    soft-cap, no dropout), without writing the shared and local logits out. The softmax is split in two: torch's
    CPU flash kernel reads `[shared ; local]` (`kernel_with_lse`), the few entries retrieved per query
    (`read.pq_*`) are one small softmax, and the two are merged by their log-sum-exps (`merge_by_lse`; UniMem eq.
    11-13 unchanged). On a segment of 512 this is ~4x faster than the explicit softmax, whose fp32 logits over ~1k
    keys per query cost more than the matmuls that fill them (docs/cost.md).

    None where the kernel does not serve (`inference_kernel`: off CPU, or a gradient needed), so the caller runs
    `joint_attention`.
    """
    assert read.pq_logits is not None and read.pq_v is not None and read.pq_visible is not None
    if not inference_kernel(query, key, value, read.k, read.v, read.pq_logits, read.pq_v):
        return None
    heads, dtype = query.shape[1], query.dtype
    size, local_size = read.k.shape[2], key.shape[2]
    if read.k.shape[1] == key.shape[1]:  # one part for the kernel: shared then local keys
        keys, values = torch.cat([read.k.to(dtype), key], 2), torch.cat([read.v.to(dtype), value], 2)
    else:  # shared entries per query head
        keys = torch.cat([_all_heads(read.k.to(dtype), heads), _all_heads(key, heads)], dim=2)
        values = torch.cat([_all_heads(read.v.to(dtype), heads), _all_heads(value, heads)], dim=2)
    mem_visible = read.visible if read.visible.shape[1] == 1 else expand_heads(read.visible, heads)
    visible = joined_visibility([(mem_visible, size), (local_visible, local_size)])
    out, lse = kernel_with_lse(query, keys, values, visible, scaling)
    work = torch.promote_types(dtype, torch.float32)  # the retrieved part's softmax, as `joint_attention`'s
    logits = read.pq_logits.to(work).masked_fill(~read.pq_visible, torch.finfo(work).min)
    retrieved_lse = torch.logsumexp(logits, -1)
    retrieved = torch.einsum("bhqk,bhqkd->bhqd", logits.softmax(-1).to(dtype), read.pq_v.to(dtype))
    # A query that sees nothing at all gets the explicit softmax's uniform row over all its entries: each part its
    # uniform mean, weighed by its number of entries (the kernel's hidden logits are the dtype's lowest plus q.k)
    blind = (lse <= torch.finfo(dtype).min / 2) & ~read.pq_visible.any(-1)
    if bool(blind.any()):
        out = torch.where(blind[..., None], expand_heads(values.mean(2, keepdim=True), heads), out)
        lse = lse.masked_fill(blind, math.log(size + local_size))
        retrieved_lse = retrieved_lse.masked_fill(blind, math.log(logits.shape[-1]))
    return merge_by_lse([(out, lse), (retrieved, retrieved_lse)])


def one_token_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    local_visible: torch.Tensor,
    read: MemoryRead,
    scaling: float,
) -> torch.Tensor:
    """`[B, Hq, 1, D]`: one decoded token over `[read ; local]` in one softmax (fp32), by grouped dot products: the
    decode path under eager attention (`decoded_token_attention` otherwise).

    Decoding calls every layer once per token: concatenating the memory to the window's keys and values (the prefix
    path) copies all of them per token, which costs more than the dot products themselves; here nothing but the
    logits is concatenated, and no key/value head is repeated (`head_scores`, `head_mix`).
    """
    size = read.k.shape[2]
    logits = torch.cat([head_scores(query, read.k.to(query.dtype)), head_scores(query, key)], dim=-1).float() * scaling
    mem_visible = expand_heads(read.visible, query.shape[1])
    rows, heads = logits.shape[0], max(mem_visible.shape[1], local_visible.shape[1])
    visible = torch.cat(
        [mem_visible.expand(rows, heads, 1, size), local_visible.expand(rows, heads, 1, key.shape[2])], dim=-1
    )
    probs = torch.softmax(logits.masked_fill(~visible, torch.finfo(torch.float32).min), dim=-1).to(query.dtype)
    return head_mix(probs[..., :size], read.v.to(query.dtype)) + head_mix(probs[..., size:], value)


def decoded_token_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    read: MemoryRead,
    scaling: float,
) -> torch.Tensor:
    """`[B, Hq, 1, D]`: one decoded token over `[read ; local]` in one softmax, through torch SDPA.

    `key`/`value` `[B, Hkv, T, D]` are the layer's whole window (its cache, post-RoPE), which grows by the decoded
    tokens while `read` is the segment's memory: `read.decoding` keeps `[memory ; window]` between steps and each
    step copies in only the window entries it has not seen. A window that did not grow (a sliding-window layer's
    rolling cache) is copied whole again. The same softmax as `one_token_attention`, at the cost of SDPA over one
    contiguous prefix (docs/cost.md, decode).
    """
    heads, window = query.shape[1], key.shape[2]
    held = read.decoding
    if held is None or window <= held.local or held.size + window > held.k.shape[2]:
        held = read.decoding = decode_keys(read, query, window)
    start, end = held.size + held.local, held.size + window
    read_heads = held.k.shape[1]
    held.k[:, :, start:end] = expand_heads(key[:, :, held.local :], read_heads)
    held.v[:, :, start:end] = expand_heads(value[:, :, held.local :], read_heads)
    if attention_mask is not None and held.visible is None:  # padding in the window: a mask from now on
        held.visible = decode_visible(read, query, held.k.shape[2])
    if held.visible is not None:
        local = local_visibility(attention_mask, 1, window, query.device) if attention_mask is not None else True
        held.visible[..., held.size : end] = local
    held.local = window
    mask = None if held.visible is None else held.visible[..., :end]
    return F.scaled_dot_product_attention(
        query, held.k[:, :, :end], held.v[:, :, :end], attn_mask=mask, scale=scaling, enable_gqa=read_heads != heads
    )


def decode_keys(read: MemoryRead, query: torch.Tensor, window: int) -> DecodeKeys:
    """Buffers for `read` and a window of `window` entries with room to grow (doubling amortises the copies)."""
    batch, _, _, dim = query.shape
    size, read_heads = read.k.shape[2], read.k.shape[1]
    capacity = size + max(2 * window, 64)
    k = query.new_empty(batch, read_heads, capacity, dim)
    v = query.new_empty(batch, read_heads, capacity, read.v.shape[-1])
    k[:, :, :size], v[:, :, :size] = read.k, read.v
    read.k, read.v = k[:, :, :size], v[:, :, :size]  # one copy of the memory while decoding
    everything = bool(read.visible.all())
    visible = None if everything else decode_visible(read, query, capacity)
    return DecodeKeys(k, v, visible, size)


def decode_visible(read: MemoryRead, query: torch.Tensor, capacity: int) -> torch.Tensor:
    """`[B, 1|Hq, 1, capacity]` bool with the memory's visibility in front (SDPA broadcasts 1 or every query head)."""
    heads = query.shape[1]
    memory = read.visible if read.visible.shape[1] == 1 else expand_heads(read.visible, heads)
    visible = torch.ones(query.shape[0], memory.shape[1], 1, capacity, dtype=torch.bool, device=query.device)
    visible[..., : read.k.shape[2]] = memory
    return visible


def _masked(logits: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    return logits.float().masked_fill(~visible, torch.finfo(torch.float32).min)


def joint_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    local_visible: torch.Tensor,
    read: MemoryRead,
    scaling: float,
    dropout: float = 0.0,
    gate: torch.Tensor | None = None,
    softcap: float | None = None,
    sink_logits: torch.Tensor | None = None,
) -> torch.Tensor:
    """`[B, Hq, q, D]`: softmax over `[per-query ; shared memory ; local]` logits (fp32), or the gated mix.
    `softcap` caps every logit as the family's own attention does (`softcap * tanh(logit / softcap)`); `sink_logits`
    `[Hq]` (`family_sink_logits`) join the softmax as one more logit per head with no value, as the family's own
    attention adds them (under the gate: in the local softmax, the family's own attention).

    `query` `[B, Hq, q, D]` and local `key`/`value` `[B, Hkv, k, D]` are post-RoPE; `local_visible` is the layer's
    own mask as bool `[B|1, 1|Hq, q, k]`. A query without any visible memory entry gets local attention only
    under the gate (its memory softmax would be empty).
    """

    def cap(logits: torch.Tensor) -> torch.Tensor:
        return logits if not softcap else torch.tanh(logits / softcap) * softcap

    mem_visible = expand_heads(read.visible, query.shape[1])
    s_loc = _masked(cap(head_scores(query, key) * scaling), local_visible)
    s_mem = [_masked(cap(head_scores(query, read.k.to(query.dtype)) * scaling), mem_visible)]
    v_parts = [read.v.to(query.dtype)]
    mem_any = mem_visible.any(-1, keepdim=True)
    if read.pq_logits is not None:
        assert read.pq_visible is not None and read.pq_v is not None  # set together (MemoryRead)
        s_mem.insert(0, _masked(cap(read.pq_logits), read.pq_visible))
        v_parts.insert(0, read.pq_v.to(query.dtype))
        mem_any = mem_any | read.pq_visible.any(-1, keepdim=True)

    def weighted(probs: torch.Tensor, values: list[torch.Tensor]) -> torch.Tensor:
        probs = F.dropout(probs, p=dropout).to(query.dtype)
        parts, start = [], 0
        for v in values:
            width = v.shape[-2]  # S entries ([B, H, S, D]) or K per query ([B, H, q, K, D])
            p = probs[..., start : start + width]
            parts.append(head_mix(p, v) if v.dim() == 4 else torch.einsum("bhqk,bhqkd->bhqd", p, v))
            start += width
        return torch.stack(parts).sum(0) if len(parts) > 1 else parts[0]

    sink = [] if sink_logits is None else [sink_logits.float().view(1, -1, 1, 1).expand(*s_loc.shape[:3], 1)]
    if gate is None:
        probs = torch.softmax(torch.cat(s_mem + [s_loc] + sink, dim=-1), dim=-1)
        return weighted(probs, v_parts + [value])  # a sink's column has no value: `weighted` stops before it
    mem_out = weighted(torch.softmax(torch.cat(s_mem, dim=-1), dim=-1), v_parts)
    loc_out = weighted(torch.softmax(torch.cat([s_loc] + sink, dim=-1), dim=-1), [value])
    alpha = torch.where(mem_any, gate.to(query.dtype), torch.zeros((), dtype=query.dtype))
    return alpha * mem_out + (1 - alpha) * loc_out
