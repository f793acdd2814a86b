"""UniMem-style K/V memory (UniMem §2-3; docs/attention_memory.md): FIFO management, direct writing of pre-RoPE
keys/values, a reading rule, injection in chosen layers through the patched attention, and optionally RMT tokens at the
input (UniMix)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...attention import AttentionCall, AttentionContext
from ...memory import RecurrentTokens, learned_tokens
from ...memory.attend import MemoryRead, attend_memory
from ...memory.kv import init_kv_state, push_kv
from ...memory.reuse import read_once
from ...method import Layout, MemoryMethod, Segment, State
from .config import UniMemConfig
from .reading import SegmentFrame, read_all, read_trams, read_union
from .trams import trams_scores


class UniMem(MemoryMethod):
    """Past keys/values of chosen layers, read by the configured rule and joined to those layers' local keys."""

    config_class = UniMemConfig
    config: UniMemConfig
    needs_attention = True
    window_slot_fields = ("memory_tokens",)

    def __init__(self, config: UniMemConfig, backbone):
        super().__init__(config, backbone)
        self.settings = config.settings()
        layers = self.default_layers(self.settings.layers) if config.memory_layers is None else config.memory_layers
        self.layers = self.resolve_layers("`memory_layers`", layers)
        m = self.settings.memory_tokens
        self.tokens = RecurrentTokens(m, backbone.embed_dim) if m else None
        self.writes_from_records = self.tokens is None  # UniMix's tokens are written from hidden states
        self.writes_from_window = True
        self.memory_init = learned_tokens(m, backbone.embed_dim, backbone.embedding_std()) if m else None
        # Original Memorizing Transformer gate: alpha_h = sigmoid(theta_h) per memory layer and query head; 0 = 1/2.
        gated = config.combine == "gated"
        self.gate = nn.Parameter(torch.zeros(len(self.layers), backbone.num_heads)) if gated else None

    def window_slots(self) -> int:
        return 2 * self.settings.memory_tokens

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        b, size = self.backbone, self.settings.memory_size
        shapes = {i: b.layer_kv_shape(i) for i in self.layers}
        state = init_kv_state(batch_size, shapes, size, device, dtype)
        if self.settings.reading == "trams":  # each stored key's metric, computed once, when it is written
            for i in self.layers:
                heads = b.num_heads if self.config.select_per == "query_head" else shapes[i][0]
                state[f"score.{i}"] = torch.zeros(batch_size, heads, size, device=device, dtype=torch.float32)
        if self.tokens is not None:
            state.update(self.tokens.init_state(batch_size, device, dtype))
        return state

    def read(
        self,
        layer: int,
        state: State,
        frame: SegmentFrame,
        call: AttentionCall,
        context: AttentionContext,
        kept: dict[str, Any] | None = None,
    ) -> MemoryRead:
        """What layer `layer`'s queries of this call read from its store (the configured reading rule); `kept`: what a
        query-dependent read keeps between the calls of one segment (`read_union`)."""
        s, k, v = self.settings, state[f"k.{layer}"], state[f"v.{layer}"]
        if s.reading == "all":
            return read_all(k, v, frame, call, context)
        if s.reading == "trams":
            return read_trams(k, v, state[f"score.{layer}"], frame, call, context, s.select_size, s.recent_keep)
        window = s.window if s.reading in ("window", "union") else 0
        global_tokens = s.global_tokens if s.reading in ("global", "union") else 0
        topk = s.topk if s.reading in ("topk", "union") else 0
        return read_union(k, v, frame, call, context, window, global_tokens, topk, kept)

    def _attend(self, layer: int, state: State, frame: SegmentFrame):
        """The layer's attention with memory: its read joined to the local keys (gated or one joint softmax).
        `all` and `trams` reads do not depend on the queries: decoding a segment token by token reads them once."""
        gate = None
        if self.gate is not None:
            gate = torch.sigmoid(self.gate[self.layers.index(layer)])[None, :, None, None]

        kept: dict[str, Any] = {}  # the query-independent part of a union/top-k read, per segment

        def read_now(call: AttentionCall, context: AttentionContext) -> MemoryRead:
            return self.read(layer, state, frame, call, context, kept)

        read = read_once(read_now) if self.settings.reading in ("all", "trams") else read_now

        def attend(call: AttentionCall, context: AttentionContext):
            return attend_memory(call, read(call, context), gate)

        return attend

    def prepare(self, segment: Segment, state: State, plan) -> Layout:
        if self.tokens is None or self.memory_init is None:
            layout = Layout()
        else:
            layout = self.tokens.layout(state, self.memory_init, segment.mask)
        positions = self.settings.positions
        filled = int(state["valid"].sum(1).max())
        dense = bool(state["valid"][:, state["valid"].shape[1] - max(filled, 1) :].all())  # readers keep >= 1 slot
        frame = SegmentFrame(
            state["pos"], state["valid"], state["seen"], layout.prefix_length, positions, filled, dense
        )
        layout.attention = AttentionContext(
            reads={i: self._attend(i, state, frame) for i in self.layers},
            record_layers=frozenset(self.layers),
            rotary=self.backbone.rotary,
        )
        return layout

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        out = self.write_records(segment, state, layout)
        if self.tokens is not None:
            out.update(self.tokens.write(state, hidden))
        return out

    def write_records(self, segment: Segment, state: State, layout: Layout) -> State:
        """The K/V store after `segment`: its tokens' recorded pre-RoPE keys and values pushed in (UniMem §3.2)."""
        start, length = layout.prefix_length, segment.ids.shape[1]
        new = {}
        for i in self.layers:
            k, v = layout.attention.records[i]
            k, v = k[:, :, start : start + length], v[:, :, start : start + length]
            new[i] = (k.detach(), v.detach()) if self.config.detach_memory else (k, v)
        scores = None
        if self.settings.reading == "trams":
            scores = {f"score.{i}": self.trams_metric(i, k) for i, (k, _) in new.items()}
        return push_kv(state, new, segment.mask, scores)

    def trams_metric(self, layer: int, keys: torch.Tensor) -> torch.Tensor:
        """TRAMS' query-independent metric `[B, Hr, L]` of keys `[B, Hkv, L, D]` written to layer `layer`'s pool
        (`trams_scores`). It depends on the key and the layer's query weights only, so it is computed once, when the
        key is written, instead of for the whole pool at every segment (TRAMS §2.2; docs/cost.md). A key keeps the
        metric of the weights it was written under, as it keeps the key projection it was written with."""
        w_q, _, norm = self.backbone.layer_query(layer)
        fold = norm if self.config.fold_norm_weight else None
        with torch.no_grad():
            return trams_scores(
                keys, w_q, fold, self.backbone.num_heads, self.config.select_score, self.config.select_per
            )
