"""Elastic Memory (Algorithm 1): in the memory layer(s), the pre-RoPE keys and the values of every past segment
live in a HiPPO-LegS state `[B, Hkv, N, D]`; each segment reads `L_mem` memory tokens out of it by polynomial
sampling and prepends them, un-rotated, to the layer's keys/values (one joint softmax, trapezoidal mask).

Choices where the paper is silent (docs/elastic_memory.md):
- The state is read with the reconstruction whose horizon is the number of tokens folded into it (the paper's
  Eq. 6 / Alg. 1 indices disagree by one block).
- Padding: a token with mask 0 is not a time step. It neither enters the compression nor advances the row's clock,
  so a padded row has exactly the state of the same tokens without padding (the runtime's positions skip padding
  the same way). Rows therefore carry their own token count and, when they differ, their own matrices.
- The state stays float32 (autocast off) whatever the backbone's dtype; gradients flow through it into the keys
  and values of earlier segments (full BPTT unless `bptt_depth` cuts it).
"""

from __future__ import annotations

import math

import torch

from ...attention import AttentionCall, AttentionContext
from ...memory.attend import MemoryRead, attend_memory
from ...memory.reuse import read_once
from ...method import Layout, MemoryMethod, Segment, State
from .config import ElasticMemoryConfig
from .hippo import HiPPOLegS
from .sampling import sample_points


def default_memory_layer(num_layers: int) -> int:
    """0-based index of the layer at 3/4 depth (the 9th of 12, like the paper's memory layer)."""
    return max(0, math.ceil(3 * num_layers / 4) - 1)


def _fold(P: torch.Tensor, K: torch.Tensor, state: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
    """`C_i = P_i C_{i-1} + K_i F_i` (Eq. 6) for `[B|1, N, N]`, `[B|1, N, L]`, `[B, H, N, D]`, `[B, H, L, D]`."""
    return P[:, None] @ state.float() + K[:, None] @ block.float()


class ElasticMemory(MemoryMethod):
    """HiPPO-compressed keys/values of past segments, read back as memory tokens in the chosen layer(s)."""

    config_class = ElasticMemoryConfig
    config: ElasticMemoryConfig
    needs_attention = True
    writes_from_records = True

    def __init__(self, config: ElasticMemoryConfig, backbone):
        super().__init__(config, backbone)
        layers = config.memory_layers
        if layers is None:  # the layer at 3/4 depth
            layers = self.default_layers(lambda n: (default_memory_layer(n),))
        self.layers = self.resolve_layers("`memory_layers`", layers)
        self.hippo = HiPPOLegS(config.hippo_order, cache_bytes=config.matrix_cache_mb << 20)

    def set_sampling(self, sampling: str, exp_alpha: float | None = None) -> None:
        """Read the memory with another strategy from now on (test-time bias injection, Sec. 3.5): the state and
        every weight stay as they are; the change is written into the config that `save_pretrained` stores."""
        checked = self.config.replace(sampling=sampling, exp_alpha=exp_alpha)
        self.config.sampling, self.config.exp_alpha = checked.sampling, checked.exp_alpha

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        b, n = self.backbone, self.config.hippo_order
        state = {"length": torch.zeros(batch_size, dtype=torch.long, device=device)}
        for i in self.layers:
            heads, width = b.layer_kv_shape(i)
            state[f"k.{i}"] = torch.zeros(batch_size, heads, n, width, device=device)
            state[f"v.{i}"] = torch.zeros(batch_size, heads, n, width, device=device)
        return state

    # ---- fixed matrices ---------------------------------------------------------------------------------------

    def readout(self, lengths: list[int], device: torch.device) -> torch.Tensor:
        """Reconstruction matrices `[B|1, L_mem, N]` for states holding `lengths` tokens (Eq. 7; zero rows at 0)."""
        if len(set(lengths)) == 1:
            return self._readout_at(lengths[0], device)[None]
        return torch.stack([self._readout_at(t, device) for t in lengths])

    def _readout_at(self, t: int, device: torch.device) -> torch.Tensor:
        cfg = self.config
        count = cfg.readout_tokens
        if t == 0:
            return torch.zeros(count, cfg.hippo_order, device=device)
        if cfg.sampling == "uniform":
            # x_j = j t / L_mem sits at 2 x_j / t - 1 = 2 j / L_mem - 1 of the Legendre interval whatever t is
            # (Sec. 2.3): one readout for every state, built at t = L_mem where the points are the integers j.
            t = count
        key = ("R", t, cfg.sampling, count, cfg.exp_alpha, str(device))
        hit = self.hippo.cache.get(key)
        if hit is not None:
            return hit
        points = sample_points(cfg.sampling, t, count, cfg.hippo_order, cfg.exp_alpha)
        return self.hippo.cache.put(key, self.hippo.basis(points, t, device))

    def block_matrices(self, lengths: list[int], real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`P` `[B|1, N, N]` and `K` `[B|1, N, L]` folding the real tokens of a segment (`real` `[B, L]`) into
        states that hold `lengths` tokens; masked slots get zero columns and do not advance the clock."""
        device, width = real.device, real.shape[1]
        counts = real.sum(1).tolist()
        if len(set(lengths)) == 1 and all(c == width for c in counts):
            s = lengths[0]
            return self.hippo.transition(s, s + width, device)[None], self.hippo.kernel(s, s + width, device)[None]
        n = self.config.hippo_order
        P = torch.empty(len(lengths), n, n, device=device)
        K = torch.zeros(len(lengths), n, width, device=device)
        for b, (s, count) in enumerate(zip(lengths, counts)):
            if count == 0:
                P[b] = torch.eye(n, device=device)
                continue
            P[b] = self.hippo.transition(s, s + count, device)
            K[b][:, real[b]] = self.hippo.kernel(s, s + count, device)
        return P, K

    # ---- runtime hooks ----------------------------------------------------------------------------------------

    def prepare(self, segment: Segment, state: State, plan) -> Layout:
        lengths = state["length"]
        context = AttentionContext(record_layers=frozenset(self.layers), rotary=self.backbone.rotary)
        if not bool((lengths > 0).any()):
            return Layout(attention=context)  # first segment: no memory, the plain layer
        R = self.readout(lengths.tolist(), lengths.device)
        visible = (lengths > 0)[:, None, None, None]  # [B, 1, 1, 1] -> every query sees every memory token

        def read(layer: int):
            def memory_tokens(call: AttentionCall, ctx: AttentionContext) -> tuple[torch.Tensor, torch.Tensor]:
                with torch.autocast(call.query.device.type, enabled=False):
                    k_mem = R[:, None] @ state[f"k.{layer}"].float()  # Eq. 8; keys stay un-rotated (Sec. 2.3)
                    v_mem = R[:, None] @ state[f"v.{layer}"].float()
                return k_mem, v_mem

            # one read per segment: decoding steps reuse it (and the buffers `attend_memory` keeps in it)
            memory = read_once(lambda call, ctx: MemoryRead(*memory_tokens(call, ctx), visible))

            def attend(call: AttentionCall, ctx: AttentionContext):
                return attend_memory(call, memory(call, ctx))  # one joint softmax

            return attend

        context.reads = {i: read(i) for i in self.layers}
        return Layout(attention=context)

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        return self.write_records(segment, state, layout)

    def write_records(self, segment: Segment, state: State, layout: Layout) -> State:
        lengths = state["length"]
        real = segment.mask.bool()
        P, K = self.block_matrices(lengths.tolist(), real)
        new = {"length": lengths + real.sum(1)}
        with torch.autocast(real.device.type, enabled=False):
            for i in self.layers:
                keys, values = layout.attention.records[i]  # pre-RoPE keys (Sec. 2.2) and values, [B, Hkv, L, D]
                new[f"k.{i}"] = _fold(P, K, state[f"k.{i}"], keys)
                new[f"v.{i}"] = _fold(P, K, state[f"v.{i}"], values)
        return new
