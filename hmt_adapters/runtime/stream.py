"""Streaming: read a chunk of packed token rows into the memory state, each row closing its own full segments and
handing its unfinished segment back (`MemoryModel.step` keeps it pending until it fills)."""

from __future__ import annotations

import torch

from ..state import MemoryState
from .packing import columns_below, shift_columns
from .segments import IGNORE_INDEX, RunResult, SegmentRuntime, closed_part


def read_stream(
    runtime: SegmentRuntime,
    ids: torch.Tensor,
    counts: torch.Tensor,
    targets: torch.Tensor | None,
    state: MemoryState,
    keep_logits: bool = True,
):
    """Read packed rows `[B, W]` (row i's `counts[i]` tokens first) from `state`, each row closing its own segments.

    Returns `(result, open_ids, open_mask)`: `result.logits` is in the packed layout (None with `keep_logits=False`:
    segments without targets then run no LM head), `result.state` has folded every row's full segments, and each
    row's unfinished segment comes back right-padded as `open_ids`/`open_mask`.
    """
    closed = closed_part(counts, runtime.config.segment_length)  # per row: tokens in whole segments
    if bool((counts == ids.shape[1]).all()):  # no padding: one call, the final short segment stays open
        result = runtime.run(ids, torch.ones_like(ids), targets, state, close_last=False, keep_logits=keep_logits)
        done = int(closed[0])
        return result, ids[:, done:], torch.ones_like(ids[:, done:])
    widest = int(closed.max())
    opened = counts - closed
    rest = int(opened.max())
    loss_sum = torch.zeros((), device=ids.device)
    num_tokens = torch.zeros((), device=ids.device, dtype=torch.long)
    logits = []
    if widest:
        mask = columns_below(closed, widest).long()
        part = None if targets is None else targets[:, :widest].masked_fill(~mask.bool(), IGNORE_INDEX)
        first = runtime.run(ids[:, :widest], mask, part, state, keep_logits=keep_logits)
        state, loss_sum, num_tokens = first.state, first.loss_sum, first.num_tokens
        logits.append(first.logits)
    open_ids, open_mask = shift_columns(ids, closed, rest), columns_below(opened, rest).long()
    if rest or not widest:  # rows' unfinished segments (or, for an all-padding batch, one empty column)
        width = max(rest, 1)
        mask = columns_below(opened, width).long()
        part = (
            None
            if targets is None
            else shift_columns(targets, closed, width, IGNORE_INDEX).masked_fill(~mask.bool(), IGNORE_INDEX)
        )
        second = runtime.run(
            shift_columns(ids, closed, width), mask, part, state, close_last=False, keep_logits=keep_logits
        )
        state, loss_sum, num_tokens = second.state, loss_sum + second.loss_sum, num_tokens + second.num_tokens
        logits.append(second.logits)
    if not keep_logits:
        return RunResult(loss_sum, num_tokens, None, state), open_ids, open_mask
    both = torch.cat([part for part in logits if part is not None], dim=1)  # every read above kept its logits
    cols = torch.arange(ids.shape[1], device=ids.device)[None, :]
    index = torch.where(cols < closed[:, None], cols, widest + cols - closed[:, None])
    rows = torch.arange(ids.shape[0], device=ids.device)[:, None]
    return RunResult(loss_sum, num_tokens, both[rows, index.clamp(max=both.shape[1] - 1)], state), open_ids, open_mask
