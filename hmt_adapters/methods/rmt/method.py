"""RMT: `[M ; segment ; M]` per segment; the outputs at the trailing M slots become the next M (input level)."""

from __future__ import annotations

import torch

from ...memory import learned_tokens, newest_or_init
from ...method import Layout, MemoryMethod, Segment, State
from .config import RMTConfig


class RMT(MemoryMethod):
    """Recurrent memory tokens: read slots before the segment, write slots after it, carried between segments."""

    config_class = RMTConfig

    def __init__(self, config: RMTConfig, backbone):
        super().__init__(config, backbone)
        m = config.num_memory_tokens
        self.memory_init = learned_tokens(m, backbone.embed_dim, backbone.embedding_std()) if m else None

    def window_slots(self) -> int:
        return 2 * self.config.num_memory_tokens

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        m = self.config.num_memory_tokens
        return {
            "memory": torch.zeros(batch_size, m, self.backbone.embed_dim, device=device, dtype=dtype),
            "memory_valid": torch.zeros(batch_size, 1, device=device, dtype=torch.bool),
        }

    def prepare(self, segment: Segment, state: State, plan) -> Layout:
        if self.memory_init is None:
            return Layout()
        memory = newest_or_init(state["memory"], state["memory_valid"], self.memory_init, self.config.num_memory_tokens)
        ones = segment.mask.new_ones(memory.shape[:2])
        return Layout(prefix=memory, prefix_mask=ones, suffix=memory, suffix_mask=ones)

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        if self.memory_init is None:
            return state
        m = self.config.num_memory_tokens
        return {"memory": hidden[:, -m:].to(state["memory"].dtype), "memory_valid": torch.ones_like(state["memory_valid"])}
