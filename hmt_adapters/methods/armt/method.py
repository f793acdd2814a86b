"""ARMT's associative memory over a Hugging Face decoder, read as a residual before each memory layer (Rodkin et al.
2024, "Associative Recurrent Memory Transformer", §3).

Per segment and memory layer `l` (state `A.{l}` `[B, F, d]`, `z.{l}` `[B, F]`, zeros before the first segment):
1. a forward pre-hook on decoder layer `l` adds `W_o(A^T phi(q) / (z . phi(q)))`, `q = W_q n(h)`, to every token's
   hidden state `h` (ARMT's read, eq. 5); `W_o` starts at zero and an empty `A` reads zero, so the first segment and an
   untrained model are exactly the bare backbone;
2. a forward hook keeps the layer's outputs for `update`;
3. `update` writes them with the delta rule (eq. 2-4): `v_old = A^T phi(k) / (z . phi(k))`,
   `A += sum_t beta_t phi(k_t) (v_t - v_old_t)^T`, `z += sum_t phi(k_t)`, padding excluded.
Beyond ARMT, which writes from memory tokens appended to the segment, every token of the segment writes (no tokens
are added to the window, and nothing has to learn to gather the segment first: it learned the passkey on a frozen
SmolLM2 where memory-token writes did not; docs/trained_memory.md). `n` is a parameter-free RMS norm: SmolLM2's
residual stream carries activations hundreds of times larger than the rest (docs/trained_memory.md).

Gradients flow through `A` and `z` across segments (`bptt_depth` cuts them). A segment decoded token by token reads
the same `A` at every step and closes from the outputs its steps kept (`writes_from_window`), so `generate` ==
`forward` without reading the segment again.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...attention import MEMORY_KWARG, AttentionContext
from ...method import Layout, MemoryMethod, Segment, State
from .config import ARMTConfig

EPS = 1e-5  # the normaliser's floor: an empty memory reads 0 / EPS = 0
HOOKED = "_armt_hooked"  # marks decoder layers that already carry the hooks


@dataclass
class AssociativeWindow(AttentionContext):
    """The context of one ARMT backbone call: the method (`owner`), the memories its layers read (`memory[l] = (A,
    z)`) and the layer outputs they produce (`outputs[l]`, one tensor per call: a decoded segment's steps)."""

    owner: ARMT | None = None
    memory: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    outputs: dict[int, list[torch.Tensor]] = field(default_factory=dict)


def _owner(kwargs: dict) -> tuple[ARMT, AssociativeWindow] | None:
    """The method and context of an ARMT call (None for any other call)."""
    window = kwargs.get(MEMORY_KWARG)
    if isinstance(window, AssociativeWindow) and window.owner is not None:
        return window.owner, window
    return None


def _read_hook(layer: int, module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """Forward pre-hook of decoder layer `layer`: the owner of an ARMT call's context adds its read to the layer's
    input hidden states (positional or keyword); without an ARMT context the layer is untouched."""
    found = _owner(kwargs)
    if found is None or layer not in found[1].memory:
        return None
    owner, window = found
    if "hidden_states" in kwargs:
        return args, {**kwargs, "hidden_states": owner.read(layer, kwargs["hidden_states"], window)}
    return (owner.read(layer, args[0], window), *args[1:]), kwargs


def _write_hook(layer: int, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
    """Forward hook of decoder layer `layer`: keep its output hidden states for the owner's `update`."""
    found = _owner(kwargs)
    if found is not None and layer in found[0].memory_layers:
        found[1].outputs.setdefault(layer, []).append(output[0] if isinstance(output, tuple) else output)


def install_hooks(layers: list[nn.Module]) -> None:
    """Put the read and write hooks on every decoder layer, once per layer."""
    for i, layer in enumerate(layers):
        if not getattr(layer, HOOKED, False):
            layer.register_forward_pre_hook(functools.partial(_read_hook, i), with_kwargs=True)
            layer.register_forward_hook(functools.partial(_write_hook, i), with_kwargs=True)
            setattr(layer, HOOKED, True)


def projection(d_in: int, d_out: int, std: float) -> nn.Linear:
    """A linear map without bias, its weights N(0, std^2) (std 0: zeros)."""
    layer = nn.Linear(d_in, d_out, bias=False)
    nn.init.normal_(layer.weight, std=std)
    return layer


def rms_normed(h: torch.Tensor) -> torch.Tensor:
    """`h / rms(h)` over the last dim, without a weight."""
    return h * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(h.dtype)


def dpfp(x: torch.Tensor, order: int) -> torch.Tensor:
    """ARMT's deterministic parameter-free projection (Schlag et al. 2021): `[relu(x), relu(-x)]` times its own
    rolls by 1..`order`, `2 * order * width` non-negative features."""
    x = torch.cat([F.relu(x), F.relu(-x)], dim=-1)
    rolled = torch.cat([x.roll(shifts=j, dims=-1) for j in range(1, order + 1)], dim=-1)
    return torch.cat([x] * order, dim=-1) * rolled


class ARMT(MemoryMethod):
    """An associative memory per layer, read as a residual before the layer and written from the layer's outputs."""

    config_class = ARMTConfig
    config: ARMTConfig
    needs_attention = True  # the memory context reaches the decoder layers through the attention seam's keyword
    # `update` reads only the layer outputs its hooks kept: a segment decoded token by token closes from its steps'
    # outputs (causal attention makes them a re-read's), not by reading it again
    writes_from_window = True

    def __init__(self, config: ARMTConfig, backbone):
        super().__init__(config, backbone)
        layers = self.default_layers(range) if config.memory_layers is None else config.memory_layers
        self.memory_layers: tuple[int, ...] = self.resolve_layers("`memory_layers`", layers)
        d, k = backbone.config.hidden_size, config.key_size
        self.query, self.key, self.value = nn.ModuleDict(), nn.ModuleDict(), nn.ModuleDict()
        self.beta, self.out = nn.ModuleDict(), nn.ModuleDict()
        for i in map(str, self.memory_layers):
            self.query[i] = projection(d, k, d**-0.5)
            self.key[i] = copy.deepcopy(self.query[i])  # a token's query finds its own key from the start
            self.value[i] = projection(d, d, d**-0.5)
            gate = nn.Linear(d, 1)
            nn.init.zeros_(gate.weight)
            nn.init.zeros_(gate.bias)  # beta = 1/2
            self.beta[i] = gate
            self.out[i] = projection(d, d, config.read_init_std)  # std 0: zeros, the bare backbone
        install_hooks(backbone.decoder_layers)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        return dpfp(x, cfg.dpfp_order) if cfg.feature_map == "dpfp" else F.elu(x) + 1

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        d, f = self.backbone.config.hidden_size, self.config.features
        state: State = {}
        for i in self.memory_layers:
            state[f"A.{i}"] = torch.zeros(batch_size, f, d, device=device, dtype=dtype)
            state[f"z.{i}"] = torch.zeros(batch_size, f, device=device, dtype=dtype)
        return state

    def prepare(self, segment: Segment, state: State, plan: Any) -> Layout:
        memory = {i: (state[f"A.{i}"], state[f"z.{i}"]) for i in self.memory_layers}
        return Layout(attention=AssociativeWindow(owner=self, memory=memory))

    def read(self, layer: int, hidden: torch.Tensor, window: AssociativeWindow) -> torch.Tensor:
        """`hidden` `[B, T, d]` plus layer `layer`'s read of its memory (ARMT eq. 5)."""
        A, z = window.memory[layer]
        q = self.features(self.query[str(layer)](rms_normed(hidden)))
        found = (q @ A.to(q.dtype)) / ((q @ z.to(q.dtype)[..., None]) + EPS)
        return hidden + self.out[str(layer)](found).to(hidden.dtype)

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        window: AssociativeWindow = layout.attention
        real = segment.mask.to(hidden.dtype)[..., None]  # [B, T, 1]: padding writes nothing
        new = dict(state)
        for i in self.memory_layers:
            h = rms_normed(torch.cat(window.outputs[i], dim=1)[:, -real.shape[1] :])
            A, z = state[f"A.{i}"], state[f"z.{i}"]
            k = self.features(self.key[str(i)](h)) * real
            v = self.value[str(i)](h)
            beta = torch.sigmoid(self.beta[str(i)](h))
            old = (k @ A.to(k.dtype)) / ((k @ z.to(k.dtype)[..., None]) + EPS)
            new[f"A.{i}"] = A + ((k * beta).transpose(1, 2) @ (v - old)).to(A.dtype)  # the delta rule (eq. 2-4)
            new[f"z.{i}"] = z + k.sum(1).to(z.dtype)
        return new
