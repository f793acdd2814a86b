"""Memory reading (UniMem §3.3): which stored entries a memory layer's queries attend to, and at which positions.

Every reader turns one layer's FIFO (pre-RoPE keys, values, stream positions, validity) into a `MemoryRead`:
- `all`: every valid entry;
- `union` of a sliding `window` (entries at stream distance <= w from the query; docs/attention_memory.md, Reading
  rules; UniMem Eq. 3 counts L keys), the first `global_tokens` entries of the buffer (UniMem's "beginning" global
  entries; they move under FIFO) and, per query and head, the `topk` entries of largest q.k among the rest (exact,
  no gradient through the indices); `window`, `global` and `topk` reading are unions with the other parts switched
  off;
- `trams`: the query-independent TRAMS selection (`trams.py`), shared by all queries.
Keys are rotated at the positions of the configured scheme (`SegmentFrame.key_positions`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

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
    dense: bool = False  # every one of the `filled` slots holds an entry in every row (no mask needed)

    def query_positions(self, call: AttentionCall) -> torch.Tensor:
        """Stream positions `[B, q]` of the call's queries, from their window positions: read tokens count as the
        segment's first token, write tokens continue after its last (distances count real tokens;
        docs/attention_memory.md, Positions).
        Taken from the call, so a segment decoded token by token (generation) gets the same distances."""
        window_pos = call.kwargs.get("position_ids")
        if window_pos is None:  # no padding: the queries are the newest slots of the window
            q_len, k_len = call.query.shape[2], call.key.shape[2]
            window_pos = torch.arange(k_len - q_len, k_len, device=self.seen.device).expand(self.seen.shape[0], q_len)
        return self.seen[:, None] + (window_pos.to(self.seen.device) - self.prefix).clamp(min=0)

    def key_positions(self, pos: torch.Tensor) -> torch.Tensor | None:
        """Window positions to rotate read entries at, given their stream positions `[B, (H,) S]`; None = as stored.

        `original` keeps true distances; `compact` packs the S read entries just before the segment (entry t at
        distance S + i - t from query i); `pos0` leaves keys unrotated (docs/attention_memory.md, Positions).
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


def gather_slots(x: torch.Tensor, slots: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Entries `slots + offset` of `x` `[B, Hx, M, D]`: per row `[B, S]` -> `[B, Hx, S, D]`, or per head `[B, Hs, *]`
    -> `[B, Hs, *, D]` where head h of `Hs` (a multiple of `Hx`) reads `x`'s head `h // (Hs / Hx)`.

    One row lookup (`F.embedding`) in the flattened store, so the key/value heads are never repeated and the rows
    are copied once (a `gather` with an index expanded over `D` is an order of magnitude slower on CPU).
    `offset` indexes into a store whose first `offset` slots the slots leave out (the empty ones).
    """
    batch, heads, size, dim = x.shape
    if slots.dim() == 2:
        slots = slots[:, None].expand(batch, heads, slots.shape[1])
    per_head = slots.shape[1]
    base = torch.arange(batch * heads, device=x.device).view(batch, heads, 1) * size + offset
    base = base.repeat_interleave(per_head // heads, dim=1)  # query head h reads key/value head h // group
    rows = (slots.reshape(batch, per_head, -1) + base).reshape(-1)
    return F.embedding(rows, x.reshape(-1, dim)).view(*slots.shape, dim)


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
    kept: dict[str, torch.Tensor] | None = None,
) -> MemoryRead:
    """Global entries and the window, shared by all queries, plus per-query top-k among the rest (UniMix).

    `kept` (one dict per layer and segment) holds what does not depend on the queries, the rotated keys of the shared
    slots and of the store and the shared values, so that decoding a segment token by token rotates the store once.

    Only the filled slots are read (the store is right-aligned, so they are its last `frame.filled`); of those, only
    the newest `window` can be in any query's window, so the per-query masks cover those slots alone. The top-k
    scores are one grouped matmul (query heads by their key/value head), the retrieved values one row lookup
    (`gather_slots`): the joint softmax then costs `topk` entries per query, not the store (UniMem eq. 11-13).
    """
    store = k.shape[2]
    size = max(frame.filled, 1)
    shift = store - size  # empty slots left out; `gather_slots` indexes the whole (contiguous) store
    k, pos, valid = k[:, :, shift:], frame.pos[:, shift:], frame.valid[:, shift:]
    batch, device = k.shape[0], k.device
    slot = torch.arange(size, device=device)
    count = valid.sum(1)
    first = size - count  # the buffer is right-aligned: the oldest valid entry
    start = size - min(window, size)  # only the newest `window` slots can be within distance `window`
    is_global = valid & (slot[None] < (first + global_tokens)[:, None])  # [B, S]
    distance = frame.query_positions(call)[:, :, None] - pos[:, None, start:]  # [B, q, W]
    in_window = valid[:, None, start:] & (distance <= window)
    g = torch.arange(global_tokens, device=device)
    g_visible = (g[None] < count[:, None])[:, None, :].expand(-1, distance.shape[1], -1)
    w_visible = in_window & ~is_global[:, None, start:]  # a global entry is read once, as global
    kept = {} if kept is None else kept
    if "k_shared" not in kept:  # global slots, then the window's
        g_slots = (first[:, None] + g[None]).clamp(max=size - 1)
        slots = torch.cat([g_slots, slot[start:].expand(batch, -1)], dim=1)
        shared_pos = frame.key_positions(gather_rows(pos, slots))
        kept["k_shared"] = rotate_at(context, gather_slots(k, slots), shared_pos, call.query)
        kept["v_shared"] = gather_slots(v, slots, shift)
    visible = torch.cat([g_visible, w_visible], dim=-1)[:, None]
    read = MemoryRead(kept["k_shared"], kept["v_shared"], visible)
    if topk == 0:
        return read
    heads, kv_heads, q_len, dim = call.query.shape[1], k.shape[1], call.query.shape[2], k.shape[-1]
    if "k_all" not in kept:
        kept["k_all"] = rotate_at(context, k, frame.key_positions(pos), call.query).to(call.query.dtype)
    k_all = kept["k_all"]
    grouped = (call.query * scaling_of(call)).reshape(batch, kv_heads, -1, dim)  # query heads by their K/V head
    logits = (grouped @ k_all.transpose(-1, -2)).view(batch, heads, q_len, size)
    # Candidates: valid, not global, not in the query's window. Before `start` no slot is in a window: one mask per
    # row, or, where every slot holds an entry, the global entries are the first slots of every row. The window
    # slots get the per-query mask.
    if frame.dense:
        logits[..., : min(global_tokens, start)] = float("-inf")
    else:
        older = valid[:, :start] & ~is_global[:, :start]
        logits[..., :start].masked_fill_(~older[:, None, None, :], float("-inf"))
    if start < size:
        rest = (valid[:, None, start:] & ~is_global[:, None, start:] & ~in_window)[:, None]  # [B, 1, q, W]
        logits[..., start:].masked_fill_(~rest, float("-inf"))
    values, index = logits.topk(min(topk, size), dim=-1, sorted=False)
    read.pq_logits = values
    read.pq_visible = values > float("-inf")
    read.pq_v = gather_slots(v, index, shift)  # [B, Hq, q, K, D]
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
    """The TRAMS selection of this layer's pool, per row and head, with the keys at the scheme's positions.

    Only the filled slots of the pool are read, and the metric is computed only where it decides something: for
    the older slots (the newest `recent_keep` are always kept, TRAMS §3.2), and only when more of them hold
    entries than `select_size - recent_keep`; otherwise every filled slot is attended. The attended entries are
    those of `trams_select` over the whole pool minus its empty slots (which attention masks anyway).
    """
    w_q, norm_weight = query_weights
    store = k.shape[2]
    filled = max(frame.filled, 1)
    shift = store - filled  # the empty slots of the right-aligned pool
    heads = call.query.shape[1] if select_per == "query_head" else k.shape[1]
    older = filled - min(recent_keep, filled)  # filled slots eligible for selection
    with torch.no_grad():
        if older <= select_size - recent_keep:  # nothing to choose: every filled slot is attended
            slots = torch.arange(shift, store, device=k.device).expand(k.shape[0], heads, filled)
        else:
            pool = k[:, :, shift : shift + older]
            scores = trams_scores(pool, w_q, norm_weight, call.query.shape[1], score, select_per)
            scores = F.pad(scores, (0, filled - older))  # the recent slots are kept whatever their score
            slots = trams_select(scores, frame.valid[:, shift:], recent_keep, select_size) + shift  # [B, Hr, S]
    keys = rotate_at(context, gather_slots(k, slots), frame.key_positions(gather_rows(frame.pos, slots)), call.query)
    return MemoryRead(keys, gather_slots(v, slots), gather_rows(frame.valid, slots)[:, :, None, :])
