"""The segment engine's side of generation: fold whole segments into memory, and read the open segment token by
token through the backbone's own cache (`MemoryGenerationCache` in `generation.py` keeps rows, states and open
segments, and hands each group's new tokens to `read_open`, which decides what happens to them).

A segment is opened from the state of the closed ones (its layout prepared once), extended by new tokens with the
backbone's cache over `[prefix ; tokens]`, and folded into memory when it fills up: from the attention records its
steps kept where the method writes from those alone (`MemoryMethod.writes_from_records`: the K/V methods), from
those and the steps' hidden states with the window's suffix run through the cache where it writes from the window
(`writes_from_window`: HMT, RMT, UniMix, MELODI), else by reading it again with the exact training-time segment
step (InfLLM: its writes use what its reads noted).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..attention import MEMORY_KWARG, unrotate_records
from ..backbones import positions_from_mask
from ..method import Layout, Segment
from ..state import MemoryState
from .segments import SegmentRuntime, closed_part, keep_rows

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
    # The attention records of each step, RoPE not undone yet (`AttentionContext.rotated_records`; None: not kept,
    # the segment is read again when it closes).
    records: list[dict[int, tuple]] | None = None
    # The final hidden states of each step's window positions, `[B, n, d]`, where the method writes from the window
    # (`MemoryMethod.writes_from_window`); None: not kept.
    hidden: list[torch.Tensor] | None = None


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


def closes_from_steps(runtime: SegmentRuntime) -> bool:
    """Whether a decoded segment closes from what its steps kept, not by reading it again: methods that write from
    attention records alone (`writes_from_records`), and methods that write from the window's hidden states and
    records (`writes_from_window`) where the backbone's cache takes the suffix's tokens in one call."""
    method = runtime.method
    if not runtime.memory_enabled or method.writes_from_records:
        return True
    return method.writes_from_window and runtime.backbone.continues_multi_token


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
        kept = closes_from_steps(runtime)
        if layout.attention is not None and not kept:  # the segment is read again when it closes
            layout.attention.record_layers = frozenset()
        elif layout.attention is not None:  # RoPE undone once when the segment closes (`unrotate_records`)
            layout.attention.rotated_records = True
        window, window_mask = runtime.assemble(segment, layout, suffix=False)
        keep_hidden = kept and runtime.memory_enabled and not method.writes_from_records
        open_ = OpenSegment(
            ids[:, :0],
            mask[:, :0],
            layout,
            window_mask[:, :0],
            None,
            ids.shape[1],
            [] if kept else None,
            [] if keep_hidden else None,
        )
        new_embeds, new_mask = window, window_mask
    else:
        fresh = ids.shape[1] - open_.ids.shape[1]
        new_embeds, new_mask = adapter.embed(ids[:, -fresh:]), mask[:, -fresh:]
    hidden, open_ = _feed(runtime, open_, new_embeds, new_mask)
    open_.ids, open_.mask = ids, mask
    return adapter.logits(hidden[:, -1:]), open_


def _feed(
    runtime: SegmentRuntime, open_: OpenSegment, embeds: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, OpenSegment]:
    """Window positions `embeds` `[B, n, d]` (mask `[B, n]`) through the open segment's cache: their final hidden
    states and the segment extended by them (its records and hidden states appended where they are kept)."""
    window_mask = torch.cat([open_.window_mask, mask.to(open_.window_mask.dtype)], dim=1)
    positions = positions_from_mask(window_mask)[:, -embeds.shape[1] :]
    context = open_.layout.attention
    extra = {} if context is None else {MEMORY_KWARG: context}
    hidden, cache = runtime.backbone.body_cached(embeds, window_mask, positions, open_.cache, **extra)
    records = open_.records
    if records is not None and context is not None:
        records = [*records, context.records]
        context.records = {}
    kept = None if open_.hidden is None else [*open_.hidden, hidden]
    return hidden, OpenSegment(
        open_.ids, open_.mask, open_.layout, window_mask, cache, open_.prepared_with, records, kept
    )


def close(
    runtime: SegmentRuntime, open_: OpenSegment, ids: torch.Tensor, mask: torch.Tensor, state: MemoryState
) -> tuple[torch.Tensor, MemoryState]:
    """Close the open segment (`open_.records` kept) with its last tokens: `ids`/`mask` `[B, segment_length]` are
    the whole segment. The new tokens go through its cache and memory is written from what every step kept, what
    reading the segment again would give (the same layout, causal attention): the records alone
    (`write_records`), or, for a method writing from the window, the records and hidden states with the window's
    suffix (HMT's and RMT's write slots) run through the cache after the tokens (`update`). Returns the last token's
    logits `[B, 1, V]` and the state after the segment."""
    assert open_.records is not None
    logits, open_ = extend(runtime, open_, ids, mask, state)
    tensors, layout = state.tensors, open_.layout
    segment = Segment(ids, mask, state.segments_seen, None)
    if open_.hidden is not None:
        runtime.method.closing_decoded(segment, layout)
        if layout.suffix is not None and layout.suffix_mask is not None:
            # A view of a parameter (MELODI's summaries) keeps `requires_grad` even under no_grad; fed as it is, it
            # reaches the backbone as a leaf needing a gradient, which hooks that track gradients (torch's FLOP
            # counter) reject
            suffix = layout.suffix if torch.is_grad_enabled() else layout.suffix.detach()
            _, open_ = _feed(runtime, open_, suffix.to(open_.hidden[-1].dtype), layout.suffix_mask)
        if layout.attention is not None:
            assert open_.records is not None
            layout.attention.records = unrotate_records(open_.records)
        assert open_.hidden is not None
        tensors = runtime.method.update(segment, tensors, layout, torch.cat(open_.hidden, dim=1))
    elif layout.attention is not None:
        assert open_.records is not None
        layout.attention.records = unrotate_records(open_.records)
        tensors = runtime.method.write_records(segment, tensors, layout)
    if tensors is not state.tensors and not runtime.method.updates_empty_rows:
        tensors = keep_rows(segment.real_rows, tensors, state.tensors)
    return logits, MemoryState(state.method, tensors, state.segments_seen + 1, extras=dict(state.extras))


def read_open(
    runtime: SegmentRuntime, open_: OpenSegment | None, ids: torch.Tensor, mask: torch.Tensor, state: MemoryState
) -> tuple[torch.Tensor, OpenSegment | None, MemoryState]:
    """Read new tokens `[g, n]` after the open segment `open_` (None: none open) on `state`: returns the logits of
    the last one `[g, 1, V]`, the open segment after them and the state of the closed segments.

    The open segment is extended through its cache where it can be (`can_extend`); when it fills up it is closed
    from what its steps kept (`close`) where they were kept, else whole segments are folded with the training-time
    step (`fold`, `fold_last`) and the rest opens a new segment (`extend`)."""
    length = runtime.config.segment_length
    if open_ is not None:
        ids = torch.cat([open_.ids, ids], dim=1)
        mask = torch.cat([open_.mask, mask], dim=1)
        if not can_extend(runtime, open_, ids.shape[1] - open_.ids.shape[1]):
            open_ = None
    if open_ is not None and open_.records is not None and ids.shape[1] >= length:
        # the open segment fills up: written from what its steps recorded, not read again
        logits, state = close(runtime, open_, ids[:, :length], mask[:, :length], state)
        open_ = None
        ids, mask = ids[:, length:], mask[:, length:]
        if not ids.shape[1]:
            return logits, None, state
    full = closed_part(ids.shape[1], length)
    if full and full == ids.shape[1]:
        state = fold(runtime, ids[:, : full - length], mask[:, : full - length], state)
        logits, state = fold_last(runtime, ids[:, full - length :], mask[:, full - length :], state)
        return logits, None, state
    if full:  # an empty fold would drop the open segment's cache and re-read it for every new token
        open_ = None
        state = fold(runtime, ids[:, :full], mask[:, :full], state)
    logits, open_ = extend(runtime, open_, ids[:, full:], mask[:, full:], state)
    return logits, open_, state
