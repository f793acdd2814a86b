"""The segment engine's side of generation: fold whole segments into memory, and read the open segment token by
token through the backbone's own cache (`MemoryGenerationCache` in `generation.py` keeps rows, states and open
segments, and calls these).

A segment is opened from the state of the closed ones (its layout prepared once), extended by new tokens with the
backbone's cache over `[prefix ; tokens]`, and folded into memory when it fills up: from the attention records its
steps kept where the method writes from those alone (`MemoryMethod.writes_from_records`: the K/V methods), else by
reading it again with the exact training-time segment step (methods that write from hidden states: HMT, RMT, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..attention import MEMORY_KWARG
from ..backbones import positions_from_mask
from ..method import Layout, Segment
from ..state import MemoryState
from .segments import SegmentRuntime, keep_rows

PREFILL_SEGMENTS = 32  # segments read per runtime call while prefilling (bounds transient memory)


@dataclass
class OpenSegment:
    """The segment being decoded: its tokens, its layout and the backbone cache over `[prefix ; tokens]`."""

    ids: torch.Tensor  # [B, r]
    mask: torch.Tensor  # [B, r]
    layout: Layout
    window_mask: torch.Tensor  # [B, P + r]
    cache: Any
    prepared_with: int  # segment tokens the layout was prepared from
    # The attention records of each step (None: not kept, the segment is read again when it closes).
    records: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] | None = None


def fold(runtime: SegmentRuntime, ids: torch.Tensor, mask: torch.Tensor, state: MemoryState) -> MemoryState:
    """`state` after whole segments `[B, n * segment_length]`, `PREFILL_SEGMENTS` at a time, keeping no logits."""
    step = PREFILL_SEGMENTS * runtime.config.segment_length
    for start in range(0, ids.shape[1], step):
        end = start + step
        state = runtime.run(ids[:, start:end], mask[:, start:end], None, state, keep_logits=False).state
    return state


def fold_last(
    runtime: SegmentRuntime, ids: torch.Tensor, mask: torch.Tensor, state: MemoryState
) -> tuple[torch.Tensor, MemoryState]:
    """Close one full segment: the logits of its last token `[B, 1, V]` (the next segment's first prediction) and
    the state after it."""
    result = runtime.run(ids, mask, None, state)
    assert result.logits is not None
    return result.logits[:, -1:], result.state


def can_extend(runtime: SegmentRuntime, open_: OpenSegment, new: int) -> bool:
    """Whether `new` tokens can go through the open segment's cache, or the segment must be read again.

    Again when the family cannot continue a cache (with several tokens), or when the layout was prepared from fewer
    tokens than the method needs for an exact one (HMT's paper query: the first j tokens).
    """
    adapter = runtime.backbone
    if not adapter.continues_cache or (new > 1 and not adapter.continues_multi_token):
        return False
    return open_.prepared_with >= runtime.method.layout_fixed_after()


def extend(
    runtime: SegmentRuntime, open_: OpenSegment | None, ids: torch.Tensor, mask: torch.Tensor, state: MemoryState
) -> tuple[torch.Tensor, OpenSegment]:
    """Feed the open segment's tokens `[B, r]` (all of them when `open_` is None: it is opened from `state`, else
    the ones `open_` has not read); returns the last token's logits `[B, 1, V]` and the extended segment."""
    adapter, method = runtime.backbone, runtime.method
    if open_ is None:
        segment = Segment(ids, mask, state.segments_seen, adapter.embed(ids), closes=False)
        if runtime.memory_enabled:
            layout = method.prepare(segment, state.tensors, method.plan([segment], state.tensors)[0])
        else:  # `disable_memory()`: the open segment is read alone too, as in `forward`
            layout = Layout()
        records_write = not runtime.memory_enabled or method.writes_from_records
        if layout.attention is not None and not records_write:  # the segment is read again when it closes
            layout.attention.record_layers = frozenset()
        window, window_mask = runtime.assemble(segment, layout, suffix=False)
        open_ = OpenSegment(
            ids[:, :0], mask[:, :0], layout, window_mask[:, :0], None, ids.shape[1], [] if records_write else None
        )
        new_embeds, new_mask = window, window_mask
    else:
        fresh = ids.shape[1] - open_.ids.shape[1]
        new_embeds, new_mask = adapter.embed(ids[:, -fresh:]), mask[:, -fresh:]
    window_mask = torch.cat([open_.window_mask, new_mask.to(open_.window_mask.dtype)], dim=1)
    positions = positions_from_mask(window_mask)[:, -new_embeds.shape[1] :]
    extra = {} if open_.layout.attention is None else {MEMORY_KWARG: open_.layout.attention}
    hidden, cache = adapter.body_cached(new_embeds, window_mask, positions, open_.cache, **extra)
    records = open_.records
    if records is not None and open_.layout.attention is not None:
        records = [*records, open_.layout.attention.records]
        open_.layout.attention.records = {}
    return adapter.logits(hidden[:, -1:]), OpenSegment(
        ids, mask, open_.layout, window_mask, cache, open_.prepared_with, records
    )


def close(
    runtime: SegmentRuntime, open_: OpenSegment, ids: torch.Tensor, mask: torch.Tensor, state: MemoryState
) -> tuple[torch.Tensor, MemoryState]:
    """Close the open segment (`open_.records` kept) with its last tokens: `ids`/`mask` `[B, segment_length]` are
    the whole segment. The new tokens go through its cache and memory is written from the records of every step,
    what reading the segment again would record (the same layout, causal attention); returns the last token's logits
    `[B, 1, V]` and the state after the segment."""
    assert open_.records is not None
    logits, open_ = extend(runtime, open_, ids, mask, state)
    tensors, context = state.tensors, open_.layout.attention
    if context is not None:
        assert open_.records is not None
        context.records = {
            layer: (
                torch.cat([r[layer][0] for r in open_.records], 2),
                torch.cat([r[layer][1] for r in open_.records], 2),
            )
            for layer in context.record_layers
        }
        segment = Segment(ids, mask, state.segments_seen, None)
        tensors = runtime.method.write_records(segment, tensors, open_.layout)
        if not runtime.method.updates_empty_rows:
            tensors = keep_rows(segment.real_rows, tensors, state.tensors)
    return logits, MemoryState(state.method, tensors, state.segments_seen + 1, extras=dict(state.extras))
