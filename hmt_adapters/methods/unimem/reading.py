"""Memory reading (UniMem §3.3): which stored entries a memory layer's queries attend to, and at which positions.

Every reader turns one layer's FIFO (pre-RoPE keys, values, stream positions, validity) into a `MemoryRead`:
- `all`: every valid entry;
- `union` of a sliding `window` (entries at stream distance <= w from the query; UniMem code, spec A6), the first
  `global_tokens` entries of the buffer (UniMem `global_pos='beginning'`, they move under FIFO; spec A3) and, per query
  and head, the `topk` entries of largest q.k among the rest (exact, no gradient through the indices); `window`,
  `global` and `topk` reading are unions with the other parts switched off;
- `trams`: the query-independent TRAMS selection (`trams.py`), shared by all queries.
Keys are rotated at the positions of the configured scheme (`SegmentFrame.key_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...attention import AttentionCall, AttentionContext, apply_rope
from ...memory.attend import MemoryRead
from .trams import trams_scores, trams_select


@dataclass
class SegmentFrame:
    """Where one segment sits in its stream; shared by every memory layer of the backbone call."""

    pos: torch.Tensor  # [B, M] stream positions of the stored entries
    valid: torch.Tensor  # [B, M] bool
    seen: torch.Tensor  # [B] real tokens before this segment
    prefix: int  # window slot of the segment's first token (input-level memory tokens come before it)
    scheme: str  # "original", "compact" or "pos0"
    filled: int  # slots that hold an entry in at least one row (the last ones of the store)

    def query_positions(self, call: AttentionCall) -> torch.Tensor:
        """Stream positions `[B, q]` of the call's queries, from their window positions: read tokens count as the
        segment's first token, write tokens continue after its last (distances count real tokens, UniMem spec A6).
        Taken from the call, so a segment decoded token by token (generation) gets the same distances."""
        window_pos = call.kwargs.get("position_ids")
        if window_pos is None:  # no padding: the queries are the newest slots of the window
            q_len, k_len = call.query.shape[2], call.key.shape[2]
            window_pos = torch.arange(k_len - q_len, k_len, device=self.seen.device).expand(self.seen.shape[0], q_len)
        return self.seen[:, None] + (window_pos.to(self.seen.device) - self.prefix).clamp(min=0)

    def key_positions(self, pos: torch.Tensor) -> torch.Tensor | None:
        """Window positions to rotate read entries at, given their stream positions `[B, (H,) S]`; None = as stored.

        `original` keeps true distances; `compact` packs the S read entries just before the segment (entry t at
        distance S + i - t from query i; TRAMS code, spec trams.md §3.7); `pos0` leaves keys unrotated (UniMem code).
        """
        if self.scheme == "pos0":
            return None
        if self.scheme == "compact":
            count = pos.shape[-1]
            return self.prefix - count + torch.arange(count, device=pos.device).expand(pos.shape[0], count)
        offset = (self.seen - self.prefix).view(-1, *([1] * (pos.dim() - 1)))
        return pos - offset


def rotate_at(
    context: AttentionContext, k: torch.Tensor, positions: torch.Tensor | None, like: torch.Tensor
) -> torch.Tensor:
    """`k` `[B, H, S, D]` rotated at `positions` `[B, S]` or per head `[B, H, S]` (unchanged without RoPE)."""
    if positions is None:
        return k
    rope = context.rope_at(positions.reshape(positions.shape[0], -1), like)
    if rope is None:
        return k
    cos, sin = (t.view(*positions.shape, t.shape[-1]) for t in rope[:2])
    if positions.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]
    return apply_rope(k, cos, sin, *rope[2:])  # rope[2]: the family's own RoPE function, if it has one


def gather_slots(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Entries `slots` of `x` `[B, Hx, M, D]`: per row `[B, S]` -> `[B, Hx, S, D]`, or per head `[B, Hs, S]` ->
    `[B, Hs, S, D]` where head h of `Hs` (a multiple of `Hx`) reads `x`'s head `h // (Hs / Hx)`."""
    batch, heads, _, dim = x.shape
    if slots.dim() == 2:
        return x.gather(2, slots[:, None, :, None].expand(batch, heads, slots.shape[1], dim))
    index = slots.reshape(batch, heads, -1)[..., None].expand(-1, -1, -1, dim)
    return x.gather(2, index).view(batch, slots.shape[1], slots.shape[2], dim)


def gather_rows(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Per-row values `x` `[B, M]` at `slots` `[B, S]` or `[B, H, S]`."""
    return x.gather(1, slots.reshape(slots.shape[0], -1)).view(slots.shape)


def scaling_of(call: AttentionCall) -> float:
    return call.scaling if call.scaling is not None else call.query.shape[-1] ** -0.5


def read_all(
    k: torch.Tensor, v: torch.Tensor, frame: SegmentFrame, call: AttentionCall, context: AttentionContext
) -> MemoryRead:
    """Every valid entry (Transformer-XL). Slots no row has filled yet are left out, so a store sized for a whole
    document costs what its filled part costs (entries are right-aligned: the filled slots are the last ones)."""
    filled = max(frame.filled, 1)
    k, v, pos, valid = k[:, :, -filled:], v[:, :, -filled:], frame.pos[:, -filled:], frame.valid[:, -filled:]
    k = rotate_at(context, k, frame.key_positions(pos), call.query)
    return MemoryRead(k, v, valid[:, None, None, :])


def read_union(
    k: torch.Tensor,
    v: torch.Tensor,
    frame: SegmentFrame,
    call: AttentionCall,
    context: AttentionContext,
    window: int,
    global_tokens: int,
    topk: int,
) -> MemoryRead:
    """Global entries and the window, shared by all queries, plus per-query top-k among the rest (UniMix)."""
    batch, _, size, _ = k.shape
    device = k.device
    slot = torch.arange(size, device=device)
    count = frame.valid.sum(1)
    first = size - count  # the buffer is right-aligned: the oldest valid entry
    start = size - min(window, size)  # only the newest `window` slots can be within distance `window`
    is_global = frame.valid & (slot[None] < (first + global_tokens)[:, None])  # [B, M]
    distance = frame.query_positions(call)[:, :, None] - frame.pos[:, None, :]  # [B, q, M]
    in_window = (frame.valid & (slot[None] >= start))[:, None, :] & (distance <= window)
    g = torch.arange(global_tokens, device=device)
    g_slots = (first[:, None] + g[None]).clamp(max=size - 1)
    g_visible = (g[None] < count[:, None])[:, None, :].expand(-1, distance.shape[1], -1)
    w_slots = slot[start:].expand(batch, -1)
    w_visible = in_window[..., start:] & ~is_global[:, None, start:]  # a global entry is read once, as global
    slots = torch.cat([g_slots, w_slots], dim=1)
    shared_pos = frame.key_positions(gather_rows(frame.pos, slots))
    k_shared = rotate_at(context, gather_slots(k, slots), shared_pos, call.query)
    read = MemoryRead(k_shared, gather_slots(v, slots), torch.cat([g_visible, w_visible], dim=-1)[:, None])
    if topk == 0:
        return read
    heads, kv_heads, q_len, dim = call.query.shape[1], k.shape[1], call.query.shape[2], k.shape[-1]
    k_all = rotate_at(context, k, frame.key_positions(frame.pos), call.query).to(call.query.dtype)
    grouped = (call.query * scaling_of(call)).reshape(batch, kv_heads, -1, dim)  # query heads by their K/V head
    logits = (grouped @ k_all.transpose(-1, -2)).view(batch, heads, q_len, size)
    candidates = (frame.valid[:, None, :] & ~is_global[:, None, :] & ~in_window)[:, None]  # [B, 1, q, M]
    values, index = logits.masked_fill_(~candidates, float("-inf")).topk(min(topk, size), dim=-1, sorted=False)
    per_kv_head = index.reshape(batch, kv_heads, -1)[..., None].expand(-1, -1, -1, dim)
    read.pq_logits = values
    read.pq_visible = values > float("-inf")
    read.pq_v = v.gather(2, per_kv_head).view(batch, heads, q_len, -1, dim)
    return read


def read_trams(
    k: torch.Tensor,
    v: torch.Tensor,
    frame: SegmentFrame,
    call: AttentionCall,
    context: AttentionContext,
    query_weights: tuple[torch.Tensor, torch.Tensor | None],
    select_size: int,
    recent_keep: int,
    score: str,
    select_per: str,
) -> MemoryRead:
    """The TRAMS selection of this layer's pool, per row and head, with the keys at the scheme's positions."""
    w_q, norm_weight = query_weights
    with torch.no_grad():
        scores = trams_scores(k, w_q, norm_weight, call.query.shape[1], score, select_per)
        slots = trams_select(scores, frame.valid, recent_keep, select_size)  # [B, Hr, S]
    keys = rotate_at(context, gather_slots(k, slots), frame.key_positions(gather_rows(frame.pos, slots)), call.query)
    return MemoryRead(keys, gather_slots(v, slots), gather_rows(frame.valid, slots)[:, :, None, :])
