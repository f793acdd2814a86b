"""Input-level memory stores: token-id tails (sensory memory), FIFO buffers of memory embeddings and RMT's
recurrent memory tokens."""

from __future__ import annotations

import torch
from torch import nn

from ..method import Layout, State


def learned_tokens(count: int, dim: int, std: float) -> nn.Parameter:
    """`[count, dim]` trainable embeddings at the scale of the backbone's token embeddings (a choice the HMT paper
    leaves open)."""
    return nn.Parameter(torch.randn(count, dim) * std)


def append_tail(
    tail_ids: torch.Tensor, tail_mask: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last `width` real tokens of `tail ++ ids` per row, right-aligned; missing slots are masked padding."""
    all_ids = torch.cat([tail_ids, ids], dim=1)
    all_mask = torch.cat([tail_mask, mask.to(tail_mask.dtype)], dim=1)
    order = torch.argsort(all_mask.long(), dim=1, stable=True)  # padding first, real tokens after, order kept
    return all_ids.gather(1, order)[:, -width:], all_mask.gather(1, order)[:, -width:]


def trim_empty_columns(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop leading columns that are padding in every row (right-aligned tails)."""
    used = mask.bool().any(0)
    if bool(used.all()):
        return ids, mask
    if not bool(used.any()):
        return ids[:, :0], mask[:, :0]
    first = int(used.nonzero()[0])
    return ids[:, first:], mask[:, first:]


def push_fifo(buffer: torch.Tensor, valid: torch.Tensor, item: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Append `item` `[B, m, d]` to a fixed-size FIFO `[B, N, d]` (oldest first), dropping the oldest entries."""
    m = item.shape[1]
    buffer = torch.cat([buffer[:, m:], item.to(buffer.dtype)], dim=1)
    valid = torch.cat([valid[:, m:], valid.new_ones(valid.shape[0], m)], dim=1)
    return buffer, valid


def newest_or_init(buffer: torch.Tensor, valid: torch.Tensor, init: torch.Tensor, count: int) -> torch.Tensor:
    """The newest `count` entries of a FIFO per row, or the learned `init` `[count, d]` where the row has none."""
    newest = buffer[:, -count:]
    has = valid[:, -1].view(-1, 1, 1)
    return torch.where(has, newest, init.to(buffer.dtype).unsqueeze(0).expand_as(newest))


class RecurrentTokens:
    """RMT's token bank (UniMem "model-forward" writing): `count` slots read before the segment and written after.

    The final hidden states at the write slots become the next segment's read and write slots; a row without a
    previous segment uses the learned `init` `[count, d]`. State: `memory` `[B, count, d]`, `memory_valid` `[B, 1]`.
    """

    def __init__(self, count: int, dim: int):
        self.count = count
        self.dim = dim

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        return {
            "memory": torch.zeros(batch_size, self.count, self.dim, device=device, dtype=dtype),
            "memory_valid": torch.zeros(batch_size, 1, device=device, dtype=torch.bool),
        }

    def layout(self, state: State, init: torch.Tensor, mask: torch.Tensor) -> Layout:
        """`[memory ; segment ; memory]`: the same tokens in the read and the write slots."""
        memory = newest_or_init(state["memory"], state["memory_valid"], init, self.count)
        ones = mask.new_ones(memory.shape[:2])
        return Layout(prefix=memory, prefix_mask=ones, suffix=memory, suffix_mask=ones)

    def write(self, state: State, hidden: torch.Tensor) -> State:
        """The bank after a segment whose window ends with the write slots (`hidden` `[B, W, d]`)."""
        return {
            "memory": hidden[:, -self.count :].to(state["memory"].dtype),
            "memory_valid": torch.ones_like(state["memory_valid"]),
        }
