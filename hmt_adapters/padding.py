"""Padded batches as per-row token streams: a row's tokens are the positions its attention mask marks.

Memory models cut segments from each row's first real token, so a padded batch is packed (every row's real tokens
moved to the left, in order) before the segment runtime, and per-token results are put back in the caller's layout
afterwards. Padding may sit anywhere in a row (left, right, or between tokens); it is skipped, never read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch

from .outputs import MemoryState
from .runtime import IGNORE_INDEX, RunResult, SegmentRuntime


@dataclass
class Packing:
    """How a `[B, T]` batch maps to its packed `[B, width]` layout (row i's real tokens in columns
    `[0, counts[i])`)."""

    mask: torch.Tensor  # [B, T] caller mask (1 = real token)
    counts: torch.Tensor  # [B] real tokens per row
    order: torch.Tensor | None  # [B, width] caller column of each packed column; None: no padding at all

    @classmethod
    def of(cls, mask: torch.Tensor) -> Packing:
        mask = mask.long()
        counts = mask.sum(1)
        if bool((counts == mask.shape[1]).all()):
            return cls(mask, counts, None)
        width = max(int(counts.max()), 1)
        order = torch.argsort(1 - mask, dim=1, stable=True)[:, :width]  # real columns first, in order
        return cls(mask, counts, order)

    @property
    def width(self) -> int:
        return self.mask.shape[1] if self.order is None else self.order.shape[1]

    @property
    def packed_mask(self) -> torch.Tensor:
        """`[B, width]`: 1 on each row's real tokens, which come first."""
        return columns_below(self.counts, self.width).long()

    def pack(self, x: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """`x` `[B, T, ...]` in packed layout `[B, width, ...]`; columns past a row's tokens hold `fill`."""
        if self.order is None:
            return x
        rows = torch.arange(x.shape[0], device=x.device)[:, None]
        packed = x[rows, self.order]  # a fresh tensor: filling it in place costs no extra copy
        return packed.masked_fill_(~self.packed_mask.bool().view(*self.order.shape, *([1] * (x.dim() - 2))), fill)

    def unpack(self, y: torch.Tensor, fill: int | float = 0) -> torch.Tensor:
        """Packed `y` `[B, width, ...]` back in the caller's layout `[B, T, ...]`; padding positions hold `fill`."""
        if self.order is None:
            return y
        rank = (self.mask.cumsum(1) - 1).clamp(0, y.shape[1] - 1)  # packed column of each caller column
        rows = torch.arange(y.shape[0], device=y.device)[:, None]
        out = y[rows, rank]
        return out.masked_fill_(~self.mask.bool().view(*self.mask.shape, *([1] * (y.dim() - 2))), fill)


def columns_below(counts: torch.Tensor, width: int) -> torch.Tensor:
    """`[B, width]` bool: column c of row i is below `counts[i]`."""
    return torch.arange(width, device=counts.device)[None, :] < counts[:, None]


def shift_columns(x: torch.Tensor, start: torch.Tensor, width: int, fill: int | float = 0) -> torch.Tensor:
    """`[B, width, ...]`: row i's columns `[start[i], start[i] + width)` of `x` (outside `x`, before or past it:
    `fill`)."""
    cols = start[:, None] + torch.arange(width, device=x.device)[None, :]
    inside = (cols >= 0) & (cols < x.shape[1])
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    out = (x[rows, cols.clamp(0, max(x.shape[1] - 1, 0))] if x.shape[1]
           else x.new_full((x.shape[0], width, *x.shape[2:]), fill))
    keep = inside.view(*inside.shape, *([1] * (x.dim() - 2)))
    return torch.where(keep, out, torch.full_like(out, fill))


def align_ends(ids: torch.Tensor, counts: torch.Tensor, segment_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows `[B, W]` (real tokens first) placed so that every row ends at the last column.

    Rows whose lengths agree modulo `segment_length` then start at a segment boundary after whole segments of
    padding, which keeps their state untouched; returns `(ids, mask)` of width `max(counts)` rounded to that.
    """
    total = int(counts.max()) if counts.numel() else 0
    lead = total - counts  # padding in front of each row
    if bool((lead % segment_length != 0).any()):
        raise ValueError("align_ends needs row lengths that agree modulo segment_length.")
    return shift_columns(ids, -lead, total), (~columns_below(lead, total)).long()


def select_rows(state: MemoryState, index: torch.Tensor) -> MemoryState:
    """The state of rows `index` (state tensors are batch-first); pending tokens follow their rows."""
    out = MemoryState(state.method, {k: v[index] for k, v in state.tensors.items()}, state.segments_seen,
                      extras=dict(state.extras))
    if state.pending_ids is not None and state.pending_mask is not None:
        out.pending_ids, out.pending_mask = state.pending_ids[index], state.pending_mask[index]
    return out


def merge_rows(parts: list[tuple[torch.Tensor, MemoryState]], batch_size: int) -> dict[str, torch.Tensor]:
    """State tensors of a whole batch from `(rows, state)` parts that cover every row once."""
    first = parts[0][1].tensors
    merged = {}
    for name, value in first.items():
        out = value.new_empty((batch_size, *value.shape[1:]))
        for rows, state in parts:
            out[rows] = state.tensors[name]
        merged[name] = out
    return merged


def read_stream(runtime: SegmentRuntime, ids: torch.Tensor, counts: torch.Tensor, targets: torch.Tensor | None,
                state: MemoryState):
    """Read packed rows `[B, W]` (row i's `counts[i]` tokens first) from `state`, each row closing its own segments.

    Returns `(result, open_ids, open_mask)`: `result.logits` is in the packed layout, `result.state` has folded
    every row's full segments, and each row's unfinished segment comes back right-padded as `open_ids`/`open_mask`.
    """
    length = runtime.config.segment_length
    closed = counts // length
    if bool((counts == ids.shape[1]).all()):  # no padding: one call, the final short segment stays open
        result = runtime.run(ids, torch.ones_like(ids), targets, state, close_last=False)
        done = int(closed[0]) * length
        return result, ids[:, done:], torch.ones_like(ids[:, done:])
    widest = int(closed.max()) * length
    opened = counts - closed * length
    rest = int(opened.max())
    loss_sum = torch.zeros((), device=ids.device)
    num_tokens = torch.zeros((), device=ids.device, dtype=torch.long)
    logits = []
    if widest:
        mask = columns_below(closed * length, widest).long()
        part = None if targets is None else targets[:, :widest].masked_fill(~mask.bool(), IGNORE_INDEX)
        first = runtime.run(ids[:, :widest], mask, part, state)
        state, loss_sum, num_tokens = first.state, first.loss_sum, first.num_tokens
        logits.append(first.logits)
    open_ids, open_mask = shift_columns(ids, closed * length, rest), columns_below(opened, rest).long()
    if rest or not widest:  # rows' unfinished segments (or, for an all-padding batch, one empty column)
        width = max(rest, 1)
        mask = columns_below(opened, width).long()
        part = None if targets is None else shift_columns(targets, closed * length, width, IGNORE_INDEX).masked_fill(
            ~mask.bool(), IGNORE_INDEX)
        second = runtime.run(shift_columns(ids, closed * length, width), mask, part, state, close_last=False)
        state, loss_sum, num_tokens = second.state, loss_sum + second.loss_sum, num_tokens + second.num_tokens
        logits.append(second.logits)
    both = torch.cat(cast("list[torch.Tensor]", logits), dim=1)  # every read above keeps its logits
    cols = torch.arange(ids.shape[1], device=ids.device)[None, :]
    index = torch.where(cols < (closed * length)[:, None], cols, widest + cols - (closed * length)[:, None])
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None]
    return RunResult(loss_sum, num_tokens, both[rows, index.clamp(max=both.shape[1] - 1)], state), open_ids, open_mask
