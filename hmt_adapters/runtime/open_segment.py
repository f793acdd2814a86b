"""The segment engine's side of generation: fold whole segments into memory, and read the open segment token by
token through the backbone's own cache (`MemoryGenerationCache` in `generation.py` keeps rows, states and open
segments, and calls these).

A segment is opened from the state of the closed ones (its layout prepared once, nothing recorded: it is read again
when it closes), extended by new tokens with the backbone's cache over `[prefix ; tokens]`, and folded into memory
with the exact training-time segment step when it fills up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..attention import MEMORY_KWARG
from ..backbones import positions_from_mask
from ..method import Layout, Segment
from ..state import MemoryState
from .segments import SegmentRuntime

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
        if layout.attention is not None:  # records feed `update`, and a segment is read again when it closes
            layout.attention.record_layers = frozenset()
        window, window_mask = runtime.assemble(segment, layout, suffix=False)
        open_ = OpenSegment(ids[:, :0], mask[:, :0], layout, window_mask[:, :0], None, ids.shape[1])
        new_embeds, new_mask = window, window_mask
    else:
        fresh = ids.shape[1] - open_.ids.shape[1]
        new_embeds, new_mask = adapter.embed(ids[:, -fresh:]), mask[:, -fresh:]
    window_mask = torch.cat([open_.window_mask, new_mask.to(open_.window_mask.dtype)], dim=1)
    positions = positions_from_mask(window_mask)[:, -new_embeds.shape[1] :]
    extra = {} if open_.layout.attention is None else {MEMORY_KWARG: open_.layout.attention}
    hidden, cache = adapter.body_cached(new_embeds, window_mask, positions, open_.cache, **extra)
    return adapter.logits(hidden[:, -1:]), OpenSegment(
        ids, mask, open_.layout, window_mask, cache, open_.prepared_with
    )
