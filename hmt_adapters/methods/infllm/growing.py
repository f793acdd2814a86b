"""`append`: a state tensor that grows along one dimension at amortised O(new) cost (InfLLM's representatives).

States are never written in place, so growing a tensor by one block meant a new tensor of the whole length: at 1M
tokens InfLLM re-allocated 30 representative tensors of up to 9.4 MB for every block cut, a copy quadratic in the
document and allocations of ever larger sizes that fragment the C heap (docs/infllm.md, "A million tokens").

Here a grown tensor is a view of a buffer with spare room along the growing dimension. Appending to the longest view
of a buffer writes the new rows into the spare room, which no existing view covers (every view of the buffer is at
most as long as the buffer's `used` rows), and returns a longer view; appending to any other tensor (a shorter,
older view of the buffer, a copy, a tensor that needs gradients) copies into a new buffer of twice the length. So
states that branch from one state (two continuations of one document) never see each other's rows.
"""

from __future__ import annotations

import weakref

import torch

MIN_ROWS = 16  # a new buffer's least room along the growing dimension

# buffer storage -> (rows written, rows of room) along its growing dimension
_USED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def append(x: torch.Tensor, new: torch.Tensor, dim: int) -> torch.Tensor:
    """`torch.cat([x, new], dim)` (same values, dtype of `x`) that reuses `x`'s buffer when `x` is its latest view."""
    new = new.to(x.dtype)
    n, k = x.shape[dim], new.shape[dim]
    if x.requires_grad or new.requires_grad:
        return torch.cat([x, new], dim)
    storage = x.untyped_storage()
    used, room = _USED.get(storage, (None, 0))
    if used == n and n + k <= room:
        size = list(x.shape)
        size[dim] = n + k
        out = x.as_strided(size, x.stride(), x.storage_offset())
        out.narrow(dim, n, k).copy_(new)
        _USED[storage] = (n + k, room)
        return out
    room = max(2 * (n + k), MIN_ROWS)
    size = list(x.shape)
    size[dim] = room
    buffer = x.new_empty(size)
    out = buffer.narrow(dim, 0, n + k)
    out.narrow(dim, 0, n).copy_(x)
    out.narrow(dim, n, k).copy_(new)
    _USED[buffer.untyped_storage()] = (n + k, room)
    return out
