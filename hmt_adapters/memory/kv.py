"""Attention-level memory store: a FIFO of pre-RoPE keys and values per memory layer, with stream positions.

Entries are right-aligned (oldest first); slots that hold nothing yet are invalid. Every memory layer stores the
same tokens, so positions and validity are shared across layers.
"""

from __future__ import annotations

import torch


def _gather_tokens(x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Reorder the token axis of `x` (`[B, T]` or `[B, H, T, D]`) by a per-row `order` `[B, T]`."""
    if x.dim() == 2:
        return x.gather(1, order)
    index = order[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3])
    return x.gather(2, index)


def init_kv_state(batch: int, layers, heads: int, dim: int, capacity: int, device, dtype) -> dict[str, torch.Tensor]:
    """An empty store of `capacity` tokens for each layer in `layers`."""
    state = {
        "pos": torch.zeros(batch, capacity, dtype=torch.long, device=device),
        "valid": torch.zeros(batch, capacity, dtype=torch.bool, device=device),
        "seen": torch.zeros(batch, dtype=torch.long, device=device),
    }
    for i in layers:
        state[f"k.{i}"] = torch.zeros(batch, heads, capacity, dim, device=device, dtype=dtype)
        state[f"v.{i}"] = torch.zeros(batch, heads, capacity, dim, device=device, dtype=dtype)
    return state


def push_kv(
    state: dict[str, torch.Tensor], new: dict[int, tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Append the segment's real tokens (`new[i] = (k, v)` `[B, H, L, D]`, `mask` `[B, L]`) and keep the newest."""
    capacity = state["valid"].shape[1]
    real = mask.bool()
    positions = state["seen"][:, None] + real.long().cumsum(1) - 1
    valid = torch.cat([state["valid"], real], dim=1)
    order = torch.argsort(valid.long(), dim=1, stable=True)[:, -capacity:]  # invalid first, then oldest -> newest
    out = {
        "pos": _gather_tokens(torch.cat([state["pos"], positions], dim=1), order),
        "valid": _gather_tokens(valid, order),
        "seen": state["seen"] + real.long().sum(1),
    }
    for i, (k, v) in new.items():
        old_k, old_v = state[f"k.{i}"], state[f"v.{i}"]
        out[f"k.{i}"] = _gather_tokens(torch.cat([old_k, k.to(old_k.dtype)], dim=2), order)
        out[f"v.{i}"] = _gather_tokens(torch.cat([old_v, v.to(old_v.dtype)], dim=2), order)
    return out
