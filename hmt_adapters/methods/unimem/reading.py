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

from ...attention import AttentionCall, AttentionContext
from ...memory.attend import MemoryRead, additive_mask, decode_keys, decode_visible, head_scores, query_slices
from .trams import trams_select


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


def head_rows(x: torch.Tensor, heads: int) -> torch.Tensor:
    """`[B, heads, 1]`: the row of slot 0 of each head's key/value head in `x` `[B, Hx, M, D]` flattened to rows
    (head h of `heads`, a multiple of `Hx`, reads `x`'s head `h // (heads / Hx)`)."""
    batch, kv_heads, size, _ = x.shape
    first = torch.arange(batch * kv_heads, device=x.device).view(batch, kv_heads, 1) * size
    return first.repeat_interleave(heads // kv_heads, dim=1)


def lookup_rows(x: torch.Tensor, slots: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Entries `slots` `[B, H, *]` of `x` `[B, Hx, M, D]`, `[B, H, *, D]`, given `first = head_rows(x, H)`: one row
    lookup (`F.embedding`) in the flattened store, so the key/value heads are never repeated and the rows are copied
    once (a `gather` with an index expanded over `D` is an order of magnitude slower on CPU)."""
    rows = (slots.reshape(*first.shape[:2], -1) + first).reshape(-1)
    return F.embedding(rows, x.reshape(-1, x.shape[-1])).view(*slots.shape, x.shape[-1])


def gather_slots(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Entries `slots` of `x` `[B, Hx, M, D]`: per row `[B, S]` -> `[B, Hx, S, D]`, or per head `[B, Hs, *]`
    -> `[B, Hs, *, D]` where head h of `Hs` (a multiple of `Hx`) reads `x`'s head `h // (Hs / Hx)` (`lookup_rows`).
    """
    if slots.dim() == 2:
        slots = slots[:, None].expand(x.shape[0], x.shape[1], slots.shape[1])
    return lookup_rows(x, slots, head_rows(x, slots.shape[1]))


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
    k = context.rotate_at(k, frame.key_positions(pos), call.query)
    return MemoryRead(k, v, valid[:, None, None, :])


@dataclass
class UnionSlots:
    """What a union read of one layer's store needs that does not depend on the queries; built once per segment.

    The store is right-aligned: only its last `size` (filled) slots are read, and of those only the newest `window`
    (from `start` on) can be within a query's window, so the per-query masks cover those slots alone.
    """

    size: int  # filled slots read
    start: int  # first slot that can be in a query's window
    g_visible: torch.Tensor  # [B, 1, G] bool: global entry g exists
    window_pos: torch.Tensor  # [B, W] stream positions of the slots from `start`
    window_hidden: torch.Tensor  # [B, W] bool: empty or global (never read as window, never retrieved)
    # [B, 1, 1, start] 0 or -inf in the query's dtype: added to the scores of the slots before `start` that cannot be
    # retrieved (empty or global); None: a dense store, whose global entries are its first slots in every row
    older_bias: torch.Tensor | None
    k_shared: torch.Tensor  # [B, Hkv, G + W, D] global then window keys, rotated
    v_shared: torch.Tensor
    k_all: torch.Tensor | None = None  # [B, Hkv, size, D] the filled store rotated, contiguous (top-k only)
    v_all: torch.Tensor | None = None
    first_rows: torch.Tensor | None = None  # [B, Hq, 1] `head_rows` of `k_all` (and `v_all`) for the query heads
    own: torch.Tensor | None = None  # [Hq, 1, G, 1] bool: query head h is position h % G of its key/value head's G

    def lookup(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Entries `index` `[B, Hq, *, K]` of `x` (`k_all` or `v_all`) for each query head, `[B, Hq, *, K, D]`."""
        assert self.first_rows is not None  # built with `k_all`
        return lookup_rows(x, index, self.first_rows)


def union_slots(
    k: torch.Tensor,
    v: torch.Tensor,
    frame: SegmentFrame,
    call: AttentionCall,
    context: AttentionContext,
    window: int,
    global_tokens: int,
    topk: int,
) -> UnionSlots:
    store = k.shape[2]
    size = max(frame.filled, 1)
    shift = store - size
    k, v, pos, valid = k[:, :, shift:], v[:, :, shift:], frame.pos[:, shift:], frame.valid[:, shift:]
    batch, device = k.shape[0], k.device
    slot = torch.arange(size, device=device)
    count = valid.sum(1)
    first = size - count  # the buffer is right-aligned: the oldest valid entry
    start = size - min(window, size)
    is_global = valid & (slot[None] < (first + global_tokens)[:, None])  # [B, S]
    hidden = ~valid | is_global
    g = torch.arange(global_tokens, device=device)
    g_slots = (first[:, None] + g[None]).clamp(max=size - 1)
    slots = torch.cat([g_slots, slot[start:].expand(batch, -1)], dim=1)  # global slots, then the window's
    shared_pos = frame.key_positions(gather_rows(pos, slots))
    dtype = call.query.dtype
    layout = UnionSlots(
        size=size,
        start=start,
        g_visible=(g[None] < count[:, None])[:, None, :],
        window_pos=pos[:, start:],
        window_hidden=hidden[:, start:],
        older_bias=None if frame.dense else additive_mask(~hidden[:, None, None, :start], dtype, float("-inf")),
        k_shared=context.rotate_at(gather_slots(k, slots), shared_pos, call.query),
        v_shared=gather_slots(v, slots),
    )
    if topk:
        rotated = context.rotate_at(k, frame.key_positions(pos), call.query)
        layout.k_all = rotated.to(call.query.dtype).contiguous()  # one copy per segment: row lookups read it flat
        layout.v_all = v.contiguous()
        heads = call.query.shape[1]
        layout.first_rows = head_rows(layout.k_all, heads)
        group = heads // k.shape[1]  # query heads per key/value head
        own = torch.arange(group, device=device) == torch.arange(heads, device=device)[:, None] % group
        layout.own = own[:, None, :, None]
    return layout


def read_union(
    k: torch.Tensor,
    v: torch.Tensor,
    frame: SegmentFrame,
    call: AttentionCall,
    context: AttentionContext,
    window: int,
    global_tokens: int,
    topk: int,
    kept: dict | None = None,
) -> MemoryRead:
    """Global entries and the window, shared by all queries, plus per-query top-k among the rest (UniMix).

    `kept` (one dict per layer and segment) holds what does not depend on the queries (`UnionSlots`: the rotated
    keys of the shared slots and of the store, their masks), so that decoding a segment token by token builds it
    once. The top-k scores are one grouped matmul (query heads by their key/value head), the retrieved entries one
    row lookup (`UnionSlots.lookup`): the joint softmax then costs `topk` entries per query, not the store (UniMem
    eq. 11-13). A decoded token's read is one set of entries at key/value-head granularity (`token_read`).
    """
    kept = {} if kept is None else kept
    if "slots" not in kept:
        kept["slots"] = union_slots(k, v, frame, call, context, window, global_tokens, topk)
    layout: UnionSlots = kept["slots"]
    q_len = call.query.shape[2]
    near = frame.query_positions(call)[:, :, None] - layout.window_pos[:, None] <= window  # [B, q, W]
    w_visible = near & ~layout.window_hidden[:, None]  # a global entry is read once, as global
    visible = torch.cat([layout.g_visible.expand(-1, q_len, -1), w_visible], dim=-1)[:, None]
    read = MemoryRead(layout.k_shared, layout.v_shared, visible)
    if topk == 0:
        return token_read(read, kept, call) if q_len == 1 else read
    assert layout.k_all is not None and layout.v_all is not None  # built for top-k (`union_slots`)
    values, index = top_candidates(call.query * scaling_of(call), layout, near, global_tokens, topk)
    if q_len == 1:  # one decoded token: the retrieved entries join the shared ones in buffers kept per segment
        kv_shape = (*layout.k_all.shape[:2], -1, layout.k_all.shape[-1])  # a key/value head's query heads' entries
        assert layout.own is not None  # built with `k_all`
        found = layout.own & (values > float("-inf"))[:, :, :, None, :]  # [B, Hq, 1, G, K]: each head its own K
        retrieved = (
            layout.lookup(layout.k_all, index).view(kv_shape),
            layout.lookup(layout.v_all, index).view(kv_shape),
            found.flatten(-2),
        )
        return token_read(read, kept, call, retrieved)
    read.pq_logits = values
    read.pq_visible = values > float("-inf")
    read.pq_v = layout.lookup(layout.v_all, index)  # [B, Hq, q, K, D]
    return read


def top_candidates(
    query: torch.Tensor, layout: UnionSlots, near: torch.Tensor, global_tokens: int, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each query head's `topk` best entries by q.k among the candidates (valid, not global, not in the query's
    window), as `top_entries` returns them: `[B, Hq, q, K]` scores and store slots. Scored and selected a slice of
    queries at a time (`query_slices`): the whole rectangle is 84 MB at segments of 512 over 5,120 entries."""
    assert layout.k_all is not None  # built for top-k (`union_slots`)
    batch, heads, q_len, _ = query.shape
    start, size = layout.start, layout.size
    # The slots from `start` on that a query cannot retrieve (in its window, empty or global), `[B, 1, q, W]`
    window_bias = None
    if start < size:
        window_bias = additive_mask(~(near | layout.window_hidden[:, None])[:, None], query.dtype, float("-inf"))
    found = []
    for rows in query_slices(q_len, batch * heads * size):
        logits = head_scores(query[:, :, rows], layout.k_all)  # [B, Hq, rows, size]
        # Before `start` no slot is in a window: one mask per row, or, where every slot holds an entry, the global
        # entries are the first slots of every row. Masks are added as 0 / -inf: a broadcast `masked_fill_` costs
        # ~7x an `add_` on CPU (docs/cost.md).
        if layout.older_bias is None:
            logits[..., : min(global_tokens, start)] = float("-inf")
        else:
            logits[..., :start].add_(layout.older_bias)
        if window_bias is not None:
            logits[..., start:].add_(window_bias[:, :, rows])
        found.append(top_entries(logits, min(topk, size)))
    if len(found) == 1:
        return found[0]
    return torch.cat([f[0] for f in found], dim=2), torch.cat([f[1] for f in found], dim=2)


def token_read(
    shared: MemoryRead,
    kept: dict,
    call: AttentionCall,
    retrieved: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> MemoryRead:
    """One decoded token's union read as one set of entries at key/value-head granularity: the entries retrieved
    for the token's query heads (`retrieved`: keys, values `[B, Hkv, G * K, D]`, the `G` query heads of a key/value
    head in turn, and their visibility `[B, Hq, 1, G * K]`, each query head seeing its own `K` found) in front of
    the shared ones; the same softmax as the per-query form (UniMem eq. 11-13).

    The read and its decode buffers (`DecodeKeys`) are kept for the segment (`kept["token"]`): the shared entries
    are copied once, and each token overwrites only the retrieved entries and the visibility (the window moves
    with the token), so its attention is one SDPA call over contiguous buffers, the key/value heads not repeated
    (`decoded_token_attention`; docs/cost.md, decode).
    """
    query, read = call.query, kept.get("token")
    top = 0 if retrieved is None else retrieved[0].shape[2]
    if read is None:
        k, v = shared.k, shared.v
        if retrieved is not None:
            k, v = torch.cat([retrieved[0], k.to(query.dtype)], dim=2), torch.cat([retrieved[1], v.to(query.dtype)], 2)
        read = MemoryRead(k, v, query.new_zeros(query.shape[0], query.shape[1], 1, k.shape[2], dtype=torch.bool))
        read.decoding = decode_keys(read, query, call.key.shape[2])
        kept["token"] = read
    held = read.decoding
    assert held is not None  # set above; `decoded_token_attention` replaces it, never clears it
    if held.visible is None:
        held.visible = decode_visible(read, query, held.k.shape[2])
    if retrieved is not None:
        held.k[:, :, :top], held.v[:, :, :top] = retrieved[0], retrieved[1]
        held.visible[..., :top] = retrieved[2]
    held.visible[..., top : held.size] = shared.visible
    read.visible = held.visible[..., : held.size]  # what a rebuild of the buffers copies
    return read


def top_entries(scores: torch.Tensor, k: int, group: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """`scores.topk(k, dim=-1, sorted=False)`, the same entries, in two cheaper passes where there are many rows.

    `torch.topk` costs ~3 ns per entry on CPU, more than the grouped matmul that computed the scores (docs/cost.md).
    The slots are dealt into `stride = n // group` interleaved groups (slot j in group j % stride); the maximum of
    each group is one vectorised reduction, and the k best entries lie in the k groups with the best maxima (a
    group outside them has k groups above its maximum, each holding an entry above every entry of it). So the
    second top-k runs over `group * k` candidates (plus the `n % group` slots left over) instead of `n`.

    The k best groups are found the same way, one level down, where `torch.topk` over the `stride` maxima would
    take its slower path (`nth_element`, ~9 ns per entry, when `64 * k > stride`; `partial_sort` below, ~2 ns): k=32
    over 5,120 slots 1.3x faster than two levels (docs/cost.md). On CPU every `topk` runs on the scores'
    `ordered_bits` (integers in the floats' order): torch's integer comparisons skip the NaN test of its float
    ones, ~1.3x faster.
    """
    n = scores.shape[-1]
    stride = n // group
    if stride <= 2 * k or scores.numel() < 128 * n:  # few rows (a decoded token): one pass is cheaper
        index = ordered_bits(scores).topk(k, dim=-1, sorted=False).indices
        return scores.gather(-1, index), index
    main = group * stride
    lead = scores.shape[:-1]
    grid = scores[..., :main].unflatten(-1, (group, stride))
    maxima = ordered_bits(grid.amax(-2))  # once: the level below reads integers
    best = (top_entries(maxima, k, group) if 64 * k > stride else maxima.topk(k, dim=-1, sorted=False))[1]
    cand = grid.gather(-1, best[..., None, :].expand(*lead, group, k)).flatten(-2)
    if main < n:
        cand = torch.cat([cand, scores[..., main:]], dim=-1)
    i = ordered_bits(cand).topk(k, dim=-1, sorted=False).indices
    in_grid = i < group * k
    ig = i.clamp(max=group * k - 1)
    slot = best.gather(-1, ig % k) + (ig // k) * stride
    return cand.gather(-1, i), torch.where(in_grid, slot, i - group * k + main)


# the signed integer type of each float type's width (`ordered_bits`)
SAME_WIDTH_INTS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """What `top_entries` ranks `x` by: on CPU its floats as signed integers of the same width in the same order
    (integers, and tensors elsewhere, as they are: a GPU's `topk` is a radix select, the same for either). A float's
    bits read as an integer order the non-negative floats correctly and the negative ones in reverse (sign and
    magnitude): flipping a negative float's magnitude bits reverses them back. -0.0 lands just below +0.0 (a tie
    either way) and a NaN with its sign bit set below every number (`torch.topk` ranks every NaN first)."""
    if not x.is_floating_point() or x.device.type != "cpu":
        return x
    bits = x.view(SAME_WIDTH_INTS[x.dtype])
    return bits ^ ((bits >> (8 * bits.element_size() - 1)) & torch.iinfo(bits.dtype).max)


def read_trams(
    k: torch.Tensor,
    v: torch.Tensor,
    metric: torch.Tensor,
    frame: SegmentFrame,
    call: AttentionCall,
    context: AttentionContext,
    select_size: int,
    recent_keep: int,
) -> MemoryRead:
    """The TRAMS selection of this layer's pool, per row and head, with the keys at the scheme's positions.

    `metric` `[B, Hr, M]` is each pool slot's TRAMS metric (`trams_scores`, kept in the state from when the key was
    written; Hr = query or key/value heads, `select_per`). Only the filled slots of the pool are read, and the
    metric decides only for the older slots (the newest `recent_keep` are always kept, TRAMS §3.2), and only when
    more of them hold entries than `select_size - recent_keep`; otherwise every filled slot is attended. The
    attended entries are those of `trams_select` over the whole pool minus its empty slots (which attention masks
    anyway).
    """
    store = k.shape[2]
    filled = max(frame.filled, 1)
    shift = store - filled  # the empty slots of the right-aligned pool
    heads = metric.shape[1]
    older = filled - min(recent_keep, filled)  # filled slots eligible for selection
    with torch.no_grad():
        if older <= select_size - recent_keep:  # nothing to choose: every filled slot is attended
            slots = torch.arange(shift, store, device=k.device).expand(k.shape[0], heads, filled)
        else:
            scores = F.pad(metric[:, :, shift : shift + older], (0, filled - older))  # the recent slots: kept anyway
            slots = trams_select(scores, frame.valid[:, shift:], recent_keep, select_size) + shift  # [B, Hr, S]
    keys = context.rotate_at(gather_slots(k, slots), frame.key_positions(gather_rows(frame.pos, slots)), call.query)
    return MemoryRead(keys, gather_slots(v, slots), gather_rows(frame.valid, slots)[:, :, None, :])
