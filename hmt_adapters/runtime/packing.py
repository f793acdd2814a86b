"""Padded batches as per-row token streams: a row's tokens are the positions its attention mask marks.

Memory models cut segments from each row's first real token, so a padded batch is packed (every row's real tokens
moved to the left, in order) before the segment runtime, and per-token results are put back in the caller's layout
afterwards. Padding may sit anywhere in a row (left, right, or between tokens); it is skipped, never read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
    out = (
        x[rows, cols.clamp(0, max(x.shape[1] - 1, 0))]
        if x.shape[1]
        else x.new_full((x.shape[0], width, *x.shape[2:]), fill)
    )
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
