"""RMT: `[M ; segment ; M]` per segment; the outputs at the trailing M slots become the next M (input level)."""

from __future__ import annotations

import torch

from ...memory import RecurrentTokens, learned_tokens
from ...method import Layout, MemoryMethod, Segment, State
from .config import RMTConfig


class RMT(MemoryMethod):
    """Recurrent memory tokens: read slots before the segment, write slots after it, carried between segments."""

    config_class = RMTConfig
    writes_from_window = True  # `update` reads the window's last hidden states
    config: RMTConfig
    window_slot_fields = ("num_memory_tokens",)

    def __init__(self, config: RMTConfig, backbone):
        super().__init__(config, backbone)
        m = config.num_memory_tokens
        self.tokens = RecurrentTokens(m, backbone.embed_dim)
        self.memory_init = learned_tokens(m, backbone.embed_dim, backbone.embedding_std()) if m else None

    def window_slots(self) -> int:
        return 2 * self.config.num_memory_tokens

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        return self.tokens.init_state(batch_size, device, dtype)

    def prepare(self, segment: Segment, state: State, plan) -> Layout:
        if self.memory_init is None:
            return Layout()
        return self.tokens.layout(state, self.memory_init, segment.mask)

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        if self.memory_init is None:
            return state
        return self.tokens.write(state, hidden)
