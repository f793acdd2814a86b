"""Attention-level memory store: a FIFO of pre-RoPE keys and values per memory layer, with stream positions.

Entries are right-aligned (oldest first); slots that hold nothing yet are invalid. Every memory layer stores the
same tokens, so positions and validity are shared across layers.
"""

from __future__ import annotations

import torch


def _token_dim(x: torch.Tensor) -> int:
    """The token axis of a store tensor: 1 of `[B, T]`, 2 of `[B, H, T]` and `[B, H, T, D]`."""
    return 1 if x.dim() == 2 else 2


def _gather_tokens(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Reorder the token axis of `x` (`[B, T]`, `[B, H, T]` or `[B, H, T, D]`) by a per-row `order` `[B, T]`."""
    if x.dim() == 2:
        return x.gather(1, order)
    if x.dim() == 3:
        return x.gather(2, order[:, None, :].expand(-1, x.shape[1], -1))
    index = order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
    return x.gather(2, index)


def init_kv_state(
    batch: int, shapes: dict[int, tuple[int, int]], capacity: int, device, dtype
) -> dict[str, torch.Tensor]:
    """An empty store of `capacity` tokens for each layer of `shapes`, `{layer: (key/value heads, head width)}`
    (`BackboneAdapter.layer_kv_shape`)."""
    state = {
        "pos": torch.zeros(batch, capacity, dtype=torch.long, device=device),
        "valid": torch.zeros(batch, capacity, dtype=torch.bool, device=device),
        "seen": torch.zeros(batch, dtype=torch.long, device=device),
    }
    for i, (heads, dim) in shapes.items():
        state[f"k.{i}"] = torch.zeros(batch, heads, capacity, dim, device=device, dtype=dtype)
        state[f"v.{i}"] = torch.zeros(batch, heads, capacity, dim, device=device, dtype=dtype)
    return state


def push_kv(
    state: dict[str, torch.Tensor],
    new: dict[int, tuple[torch.Tensor, torch.Tensor]],
    mask: torch.Tensor,
    per_token: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Append the segment's real tokens (`new[i] = (k, v)` `[B, H, L, D]`, `mask` `[B, L]`) and keep the newest.
    `per_token`: other entries of the store kept per token (`[B, H, L]`, by state key), pushed the same way."""
    capacity = state["valid"].shape[1]
    real = mask.bool()
    positions = state["seen"][:, None] + real.long().cumsum(1) - 1
    valid = torch.cat([state["valid"], real], dim=1)
    if bool((valid[:, 1:] >= valid[:, :-1]).all()):
        # Every row is already invalid first, then oldest -> newest (a right-aligned store and a segment without
        # padding before real tokens): the sort below is the identity, and the newest `capacity` entries are the
        # last ones. Kept by slicing: one copy of the store, where a gather whose index is expanded over the head
        # dimension is several times slower on CPU (as `reading.lookup_rows` notes).
        def keep(old: torch.Tensor, pushed: torch.Tensor) -> torch.Tensor:
            return newest(old, pushed.to(old.dtype), _token_dim(old), capacity)

    else:
        order = torch.argsort(valid.long(), dim=1, stable=True)[:, -capacity:]  # invalid first, then oldest -> newest

        def keep(old: torch.Tensor, pushed: torch.Tensor) -> torch.Tensor:
            return _gather_tokens(torch.cat([old, pushed.to(old.dtype)], dim=_token_dim(old)), order)

    out = {
        "pos": keep(state["pos"], positions),
        "valid": keep(state["valid"], real),
        "seen": state["seen"] + real.long().sum(1),
    }
    for i, (k, v) in new.items():
        out[f"k.{i}"], out[f"v.{i}"] = keep(state[f"k.{i}"], k), keep(state[f"v.{i}"], v)
    for name, pushed in (per_token or {}).items():
        out[name] = keep(state[name], pushed)
    return out


def newest(old: torch.Tensor, new: torch.Tensor, dim: int, capacity: int) -> torch.Tensor:
    """The last `capacity` entries along `dim` of `old` followed by `new`, as a new tensor (never a view of
    either: the state is replaced, not aliased)."""
    drop = old.shape[dim] + new.shape[dim] - capacity  # entries pushed out, oldest first
    if drop >= old.shape[dim]:
        return new.narrow(dim, drop - old.shape[dim], capacity).clone()
    return torch.cat([old.narrow(dim, drop, old.shape[dim] - drop), new], dim=dim)
