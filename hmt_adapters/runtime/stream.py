"""Streaming (`MemoryModel.step`): read the next chunk of each row's stream into the memory state. The tokens a
row's last call left in an unfinished segment are read again in front of the chunk; each row closes its own full
segments and hands its unfinished one back, kept in the state as pending until it fills."""

from __future__ import annotations

import torch

from ..state import MemoryState
from .packing import Packing, columns_below, shift_columns
from .segments import IGNORE_INDEX, RunResult, SegmentRuntime, closed_part, shift_targets


def read_stream(
    runtime: SegmentRuntime,
    state: MemoryState,
    ids: torch.Tensor,
    mask: torch.Tensor,
    labels: torch.Tensor | None = None,
    keep_logits: bool = True,
) -> RunResult:
    """Read a chunk `ids` `[B, n]` (`mask` 0: padding, skipped) after `state`.

    `labels` `[B, n]` give next-token targets inside the chunk (a chunk's first token predicts nothing from the
    previous chunk, as in `forward` over the concatenation). The result's logits `[B, n, V]` are in the chunk's layout
    (None with `keep_logits=False`); its state is the one after the chunk, each row's unfinished segment pending.
    """
    pending = state.pending_length
    if pending and state.pending_ids is not None and state.pending_mask is not None:
        ids_all = torch.cat([state.pending_ids.to(ids.device), ids], dim=1)
        mask_all = torch.cat([state.pending_mask.to(mask.device).long(), mask], dim=1)
    else:
        ids_all, mask_all = ids, mask
    targets = None
    if labels is not None:
        chunk = Packing.of(mask)
        inside = chunk.unpack(shift_targets(chunk.pack(labels, IGNORE_INDEX)), IGNORE_INDEX)
        targets = torch.cat([inside.new_full((ids.shape[0], pending), IGNORE_INDEX), inside], dim=1)
    stream = Packing.of(mask_all)
    # without padding the pending tokens are the first columns of every row: read again to rebuild their segment,
    # they need no LM head (chunks of a quarter segment: 2.5x fewer LM-head rows)
    skip = pending if stream.order is None and ids.shape[1] else 0
    result, open_ids, open_mask = read_packed(
        runtime,
        stream.pack(ids_all),
        stream.counts,
        None if targets is None else stream.pack(targets, IGNORE_INDEX),
        state,
        keep_logits=keep_logits,
        logits_from=skip,
    )
    if open_ids.shape[1]:
        result.state.pending_ids, result.state.pending_mask = open_ids, open_mask
    if result.logits is not None:
        result.logits = stream.unpack(result.logits)[:, pending - skip :]
    return result


def read_packed(
    runtime: SegmentRuntime,
    ids: torch.Tensor,
    counts: torch.Tensor,
    targets: torch.Tensor | None,
    state: MemoryState,
    keep_logits: bool = True,
    logits_from: int = 0,
) -> tuple[RunResult, torch.Tensor, torch.Tensor]:
    """Read packed rows `[B, W]` (row i's `counts[i]` tokens first) from `state`, each row closing its own segments.

    Returns `(result, open_ids, open_mask)`: `result.logits` is in the packed layout (None with `keep_logits=False`:
    segments without targets then run no LM head), `result.state` has folded every row's full segments, and each
    row's unfinished segment comes back right-padded as `open_ids`/`open_mask`. `logits_from=k` (rows without
    padding only) leaves the first k columns out of the logits (`SegmentRuntime.run`).
    """
    closed = closed_part(counts, runtime.config.segment_length)  # per row: tokens in whole segments
    if bool((counts == ids.shape[1]).all()):  # no padding: one call, the final short segment stays open
        result = runtime.run(
            ids,
            torch.ones_like(ids),
            targets,
            state,
            close_last=False,
            keep_logits=keep_logits,
            logits_from=logits_from,
        )
        done = int(closed[0])
        return result, ids[:, done:], torch.ones_like(ids[:, done:])
    if logits_from:
        raise ValueError("`logits_from` needs rows without padding (each row's first columns are the ones left out).")
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
