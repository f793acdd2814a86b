"""UniMem-style K/V memory: direct writing of pre-RoPE keys/values, FIFO management, reading and injection in
chosen layers through the patched attention (UniMem §2-3, spec §9)."""

from __future__ import annotations

import torch

from ...attention import AttentionCall, AttentionContext, rotate
from ...memory.kv import init_kv_state, push_kv
from ...method import Layout, MemoryMethod, Segment, State
from .config import UniMemConfig


class UniMem(MemoryMethod):
    """Past keys/values of chosen layers, prepended to those layers' keys/values in one joint softmax."""

    config_class = UniMemConfig
    needs_attention = True

    def __init__(self, config: UniMemConfig, backbone):
        super().__init__(config, backbone)
        n = backbone.num_layers
        layers = tuple(range(n)) if config.memory_layers is None else tuple(config.memory_layers)
        bad = [i for i in layers if i >= n]
        if bad:
            raise ValueError(f"`memory_layers` must lie in [0, {n - 1}] for this {n}-layer backbone, got {bad}.")
        self.layers = tuple(sorted(set(layers)))

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        b = self.backbone
        return init_kv_state(batch_size, self.layers, b.num_kv_heads, b.head_dim, self.config.memory_size, device, dtype)

    def key_positions(self, state: State, prefix_real: torch.Tensor) -> torch.Tensor | None:
        """Window positions at which stored keys are rotated, `[B, M]` (None: keys used as stored)."""
        scheme = self.config.positions
        if scheme == "pos0":
            return None
        if scheme == "compact":
            capacity = state["valid"].shape[1]
            return prefix_real[:, None] - capacity + torch.arange(capacity, device=prefix_real.device)[None]
        return state["pos"] + (prefix_real - state["seen"])[:, None]  # original stream distances

    def prepare(self, segment: Segment, state: State, plan) -> Layout:
        prefix_real = torch.zeros(segment.ids.shape[0], dtype=torch.long, device=segment.ids.device)
        key_pos = self.key_positions(state, prefix_real)
        visible = state["valid"][:, None, None, :]  # [B, 1, 1, M]

        def read(layer: int):
            def attend(call: AttentionCall, context: AttentionContext):
                k, v = state[f"k.{layer}"], state[f"v.{layer}"]
                rope = None if key_pos is None else context.rope_at(key_pos, call.query)
                if rope is not None:
                    k = rotate(k, *rope)
                return call.run_with_prefix(k, v, visible)

            return attend

        context = AttentionContext(
            reads={i: read(i) for i in self.layers}, record_layers=frozenset(self.layers), rotary=self.backbone.rotary
        )
        return Layout(attention=context)

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        start, length = layout.prefix_length, segment.ids.shape[1]
        new = {}
        for i in self.layers:
            k, v = layout.attention.records[i]
            k, v = k[:, :, start : start + length], v[:, :, start : start + length]
            new[i] = (k.detach(), v.detach()) if self.config.detach_memory else (k, v)
        return push_kv(state, new, segment.mask)
