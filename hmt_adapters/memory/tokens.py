"""Input-level memory stores: token-id tails (sensory memory) and FIFO buffers of memory embeddings."""

from __future__ import annotations

import torch
from torch import nn


def learned_tokens(count: int, dim: int, std: float) -> nn.Parameter:
    """`[count, dim]` trainable embeddings at the scale of the backbone's token embeddings (HMT spec §3.1)."""
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
