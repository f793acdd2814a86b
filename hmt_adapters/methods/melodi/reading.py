"""MELODI's two attention reads: the short-term prefix (one joint softmax) and the gated long-term cross-attention.

Both run through the user's attention implementation (`AttentionCall`), so sdpa/eager, GQA and a family's own
query scaling (OPT pre-scales queries) apply to memory exactly as to the window's own keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from ...attention import AttentionCall, AttentionContext, rotate
from ...backbones import BackboneAdapter
from ...memory.reuse import read_once

Read = Callable[[AttentionCall, AttentionContext], tuple[torch.Tensor, torch.Tensor | None]]


def short_term_read(backbone: BackboneAdapter, layer: int, memory: torch.Tensor, valid: torch.Tensor) -> Read:
    """Layer `layer` attends `[z ; window]` in one softmax, `z` = short-term memory `[B, S, D]` (MELODI eq. 1).

    Keys/values of `z` come from the layer's own norm and K/V projections (`z` has no parameters of its own,
    MELODI §3.2). RoPE: `z` sits at positions `-S..-1`, right before the window's tokens at `0..` (MELODI's
    `z` at `0..S-1` with the window after it, shifted by `S`: the same relative offsets, and the window keeps the
    positions the backbone gives it alone). Learned-position families use the keys as computed. Rows whose
    memory is still empty (`valid` `[B]` False) see none of it: the trapezoid mask of MELODI Fig. 2 otherwise.
    """

    size = memory.shape[1]
    visible = valid[:, None, None, None].expand(-1, 1, 1, size)

    def memory_kv(call: AttentionCall, context: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = backbone.layer_kv(layer, memory.to(call.query.dtype))
        positions = torch.arange(-size, 0, device=memory.device).expand(memory.shape[0], size)
        rope = context.rope_at(positions, call.query)
        return (keys if rope is None else rotate(keys, *rope)), values

    prefix = read_once(memory_kv)  # the same for every token decoded in the window

    def read(call: AttentionCall, context: AttentionContext):
        return call.run_with_prefix(*prefix(call, context), visible)

    return read


def long_term_read(
    self_read: Read | None, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, gate: torch.Tensor
) -> Read:
    """`A = alpha_h * A_x + (1 - alpha_h) * A_s` before the output projection (MELODI §3.3, Fig. 3).

    `A_s` is the layer's self-attention (`self_read`, with the short-term prefix when the layer has one); `A_x` is
    a second, unmasked softmax of the same queries over the stored pre-RoPE `keys`/`values` `[B, Hkv, N, D]`.
    Cross-attention is position-free: un-rotated query against un-rotated key (docs/melodi.md; every stored key
    behaves as if at the query's own position). `gate` `[H]` holds `beta_h`, `alpha_h = sigmoid(beta_h)`; rows with
    an empty store (`valid` `[B, N]` all False) keep `A = A_s`, exactly.
    """

    def read(call: AttentionCall, context: AttentionContext):
        own, _ = call.run() if self_read is None else self_read(call, context)
        has = valid.any(-1)  # [B]
        # rows without entries attend to zeros (no all-masked softmax, whose NaN would poison gradients); gated off
        visible = (valid | ~has[:, None])[:, None, None, :]
        query = context.pre_rope(call, call.query)
        cross, _ = dataclasses.replace(call, query=query).run(keys.to(own.dtype), values.to(own.dtype), visible)
        alpha = torch.sigmoid(gate).to(own.dtype)[None, None, :, None] * has[:, None, None, None].to(own.dtype)
        return own + alpha * (cross - own), None  # attention outputs are [B, q, H, D]

    return read
