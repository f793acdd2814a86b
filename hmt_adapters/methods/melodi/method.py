"""MELODI over a Hugging Face decoder: summary tokens, per-layer short-term memory, one long-term layer.

Per window `k` (= segment; MELODI §3, window-major as App. C.1):
1. the window is `[x ; u]`: the tokens, then `S` summary tokens `U0` (the layout's suffix, so they carry no
   logits and no loss, and no context token sees them: they come after every token under the causal mask);
2. each short-term layer `l` attends `[z_{k-1}^l ; x ; u]` (`reads.short_term_read`);
3. after each layer with mixers, a forward hook rewrites the summary slots to `T_u^l Y` and keeps
   `z_k^l = T_z^l Y` (and, at the long-term layer, `T_m Y`) for `update`;
4. the long-term layer blends its self-attention with a cross-attention over the FIFO (`reads.long_term_read`);
5. `update` (only for windows that close) makes `z_k` the new short-term memory and pushes the K/V of `T_m Y` into
   the long-term FIFO. A streaming window that is still open changes no state, so `step` == `forward`.

Gradients flow through `z` and the long-term K/V across windows (MELODI App. C.1 trains 8 windows with full BPTT);
`bptt_depth` cuts them (the runtime detaches every state tensor), which is the paper's stop-gradient between
training segments (docs/melodi.md). The top memory layer has no `T_u`: the summaries it would send up are read by no
memory layer and are discarded with the top-layer summaries (MELODI §3.2), so that mixer could never learn.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ...attention import MEMORY_KWARG, AttentionCall, AttentionContext
from ...memory import learned_tokens
from ...memory.kv import init_kv_state, push_kv
from ...method import Layout, MemoryMethod, Segment, State
from .config import MelodiConfig
from .mixers import average_pool, mix, pass_summaries
from .reading import Read, long_term_read, short_term_read


@dataclass
class MelodiWindow(AttentionContext):
    """The attention context of one MELODI backbone call, plus what its layer hooks produce.

    `owner` is the method whose mixers act on this call; `token_mask` `[B, W']` covers the window's token slots;
    `short_term[l]` (`z_k^l`) and `long_term` (`T_m Y`) are filled by the hooks as the layers run. `cached` says
    whether the latest attention call continued a KV cache (token-by-token decoding of an open window, which has
    no summary slots: the mixers run when the whole window is read, MELODI App. C.2).

    A window decoded token by token keeps, per layer with mixers, its tokens' outputs of every call (`steps`); when
    it closes (`closing`, set by `Melodi.closing_decoded`) only the summary slots run through the cache, and each
    layer's mixers read `[the steps' token outputs ; the summaries' outputs]`: the `Y` a whole read of the window
    gives (no token sees a summary), without reading the tokens again (docs/melodi.md, "Decoding").
    """

    owner: Melodi | None = None
    token_mask: torch.Tensor | None = None
    short_term: dict[int, torch.Tensor] = field(default_factory=dict)
    long_term: torch.Tensor | None = None
    cached: bool = False
    steps: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    closing: bool = False

    def attend(self, call: AttentionCall):
        self.cached = call.key.shape[2] != call.query.shape[2]
        return super().attend(call)


BRANCHING = "_melodi_branching"  # marks decoder layers that already carry the hook


def _branching_hook(layer: int, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
    """Forward hook of decoder layer `layer`: the owner of a MELODI call's context rewrites the layer output.

    Stateless (the method travels in the call's context), so copies of the model and several MELODI wrappers of one
    backbone each act on their own calls only; without a MELODI context the layer is untouched.
    """
    window = kwargs.get(MEMORY_KWARG)
    if not isinstance(window, MelodiWindow) or window.owner is None:
        return None
    hidden = window.owner.branch(layer, output[0] if isinstance(output, tuple) else output, window)
    if hidden is None:
        return None
    return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def install_branching(layers: list[nn.Module]) -> None:
    """Put `_branching_hook` on every decoder layer, once per layer."""
    for i, layer in enumerate(layers):
        if not getattr(layer, BRANCHING, False):
            layer.register_forward_hook(functools.partial(_branching_hook, i), with_kwargs=True)
            setattr(layer, BRANCHING, True)


class Melodi(MemoryMethod):
    """MELODI: hierarchical short-term (recurrent, every chosen layer) and long-term (FIFO, one layer) compression."""

    config_class = MelodiConfig
    config: MelodiConfig
    needs_attention = True
    window_slot_fields = ("summary_length",)
    # a decoded window closes by running its summary slots through its cache (`closing_decoded`), not read again
    writes_from_window = True

    def __init__(self, config: MelodiConfig, backbone):
        super().__init__(config, backbone)
        short = self.default_layers(range) if config.short_term_layers is None else config.short_term_layers
        long = (
            self.default_layers(lambda n: (n // 2,))[0] if config.long_term_layer is None else config.long_term_layer
        )
        self.resolve_layers("`short_term_layers` and `long_term_layer`", (*short, long))
        short = self.resolve_layers("`short_term_layers`", short)
        self.short_term_layers: tuple[int, ...] = short if config.use_short_term else ()
        self.long_term_layer: int | None = long if config.use_long_term else None
        window, s = config.segment_length, config.summary_tokens
        top = max((*self.short_term_layers, -1 if self.long_term_layer is None else self.long_term_layer))
        # U0 (MELODI §3.2 "learnable embeddings"), at the scale of the token embeddings (init not in the paper)
        self.summary_embeddings = learned_tokens(s, backbone.embed_dim, backbone.embedding_std())
        self.mixer_up = nn.ParameterDict(
            {str(i): nn.Parameter(pass_summaries(s, window)) for i in self.short_term_layers if i < top}
        )  # T_u^l
        self.mixer_memory = nn.ParameterDict(
            {str(i): nn.Parameter(pass_summaries(s, window)) for i in self.short_term_layers}
        )  # T_z^l
        if self.long_term_layer is not None:
            self.mixer_long_term = nn.Parameter(average_pool(config.long_term_tokens, window, s))  # T_m
            beta = math.log(config.gate_init / (1.0 - config.gate_init))
            self.gate = nn.Parameter(torch.full((backbone.num_heads,), beta))  # alpha_h = sigmoid(beta_h)
        install_branching(backbone.decoder_layers)

    def window_slots(self) -> int:
        return self.config.summary_tokens

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        b, s = self.backbone, self.config.summary_tokens
        state: State = {}
        if (layer := self.long_term_layer) is not None:
            capacity = self.config.long_term_tokens * self.config.long_term_windows
            state.update(init_kv_state(batch_size, {layer: b.layer_kv_shape(layer)}, capacity, device, dtype))
        if self.short_term_layers:
            state["z_valid"] = torch.zeros(batch_size, dtype=torch.bool, device=device)
            for i in self.short_term_layers:
                state[f"z.{i}"] = torch.zeros(batch_size, s, b.config.hidden_size, device=device, dtype=dtype)
        return state

    # ---- per window ---------------------------------------------------------------------------------------------

    def prepare(self, segment: Segment, state: State, plan: Any) -> Layout:
        batch = segment.ids.shape[0]
        reads: dict[int, Read] = {}
        if self.short_term_layers and bool(state["z_valid"].any()):  # window 1: no prefix at all (exactly the base)
            for i in self.short_term_layers:
                reads[i] = short_term_read(self.backbone, i, state[f"z.{i}"], state["z_valid"])
        m = self.long_term_layer
        if m is not None and bool(state["valid"].any()):
            # entries are right-aligned: skip the slots no row has filled yet (the store is preallocated)
            start = int(state["valid"].any(0).long().argmax())
            keys, values = state[f"k.{m}"][:, :, start:], state[f"v.{m}"][:, :, start:]
            reads[m] = long_term_read(reads.get(m), keys, values, state["valid"][:, start:], self.gate)
        context = MelodiWindow(reads=reads, rotary=self.backbone.rotary, owner=self, token_mask=segment.mask)
        assert segment.embeds is not None  # prepare runs on embedded segments
        summaries = self.summary_embeddings.unsqueeze(0).expand(batch, -1, -1).to(segment.embeds.dtype)
        ones = segment.mask.new_ones(batch, summaries.shape[1])
        return Layout(suffix=summaries, suffix_mask=ones, attention=context)

    def branch(self, layer: int, hidden: torch.Tensor, window: MelodiWindow) -> torch.Tensor | None:
        """Summary branching after decoder layer `layer` (MELODI §3.2, Fig. 2): keep `z = T_z Y` (and `T_m Y` at the
        long-term layer) for `update`, send `T_u Y` up in the summary slots. None leaves the layer's output as is."""
        assert window.token_mask is not None  # set by prepare
        mixers = self._mixers_of(layer)
        if not mixers:
            return None
        if window.closing:  # a decoded window's summary slots after its steps' tokens (`closing_decoded`)
            return self._mixed(layer, mixers, torch.cat([*window.steps.pop(layer, []), hidden], 1), window).get("up")
        if window.cached or hidden.shape[1] != window.token_mask.shape[1] + self.config.summary_tokens:
            window.steps.setdefault(layer, []).append(hidden)  # tokens of a window decoded step by step
            return None
        outputs = self._mixed(layer, mixers, hidden, window)
        if "up" not in outputs:
            return None
        return torch.cat([hidden[:, : window.token_mask.shape[1]], outputs["up"]], dim=1)

    @staticmethod
    def _mixed(
        layer: int, mixers: dict[str, torch.Tensor], hidden: torch.Tensor, window: MelodiWindow
    ) -> dict[str, torch.Tensor]:
        """Layer `layer`'s `mixers` (`_mixers_of`) applied to its whole output `Y = [tokens ; summaries]`, by role;
        keeps `z` and `T_m Y` in `window` for `update`."""
        assert window.token_mask is not None  # set by prepare (and `closing_decoded`)
        mixed = mix(torch.cat(list(mixers.values())), hidden, window.token_mask)
        outputs = dict(zip(mixers, mixed.split([w.shape[0] for w in mixers.values()], dim=1)))
        if "memory" in outputs:
            window.short_term[layer] = outputs["memory"]
        if "long_term" in outputs:
            window.long_term = outputs["long_term"]
        return outputs

    def _mixers_of(self, layer: int) -> dict[str, torch.Tensor]:
        """The token mixers after decoder layer `layer`, by role (`memory` T_z, `long_term` T_m, `up` T_u)."""
        key, mixers = str(layer), {}
        if key in self.mixer_memory:
            mixers["memory"] = self.mixer_memory[key]
        if layer == self.long_term_layer:
            mixers["long_term"] = self.mixer_long_term
        if key in self.mixer_up:
            mixers["up"] = self.mixer_up[key]
        return mixers

    def closing_decoded(self, segment: Segment, layout: Layout) -> None:
        """The decoded window closes: its summary slots run through its cache next, and the mixers read the steps'
        token outputs kept in its context with theirs (`MelodiWindow`), under the whole window's token mask."""
        window: MelodiWindow = layout.attention
        window.token_mask, window.closing = segment.mask, True

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        window: MelodiWindow = layout.attention
        new = dict(state)
        for i in self.short_term_layers:
            new[f"z.{i}"] = window.short_term[i].to(state[f"z.{i}"].dtype)
        if self.short_term_layers:
            new["z_valid"] = torch.ones_like(state["z_valid"])
        m = self.long_term_layer
        if m is not None:
            assert window.long_term is not None  # the hook of layer m filled it
            # K/V of the long-term tokens from layer M's own norm and projections, computed once at store time
            # (MELODI §3.3); stored pre-RoPE and read position-free
            keys, values = self.backbone.layer_kv(m, window.long_term)
            real = segment.mask.new_ones(keys.shape[0], keys.shape[2])
            store = {name: state[name] for name in ("pos", "valid", "seen", f"k.{m}", f"v.{m}")}
            new.update(push_kv(store, {m: (keys, values)}, real))
        return new
