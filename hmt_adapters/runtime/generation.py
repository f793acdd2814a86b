"""Generation with memory through transformers' own `generate`.

`MemoryGenerationCache` is the cache (`past_key_values` before transformers 5.24) HF generate carries from step to
step. It keeps, per group of rows, the memory state of the closed segments and the open segment with the backbone's
own cache, so decoding reads one token per step inside the open segment; when a segment fills up it is folded into
memory with the exact training-time segment step and a new segment opens. It computes nothing itself: reading is
the segment engine's (`open_segment.py`). Prompts of any length are read segment by segment, a bounded number at a
time, each row from its first real token; rows whose segments close at different steps decode in separate groups.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from transformers import GenerationConfig

from ..state import MemoryState, merge_rows, select_rows
from .open_segment import OpenSegment, read_open
from .packing import Packing, align_ends
from .segments import SegmentRuntime, closed_part

WORKING_MODES = ("greedy_search", "sample", "beam_search", "beam_sample")


class _RightPaddingWarning(logging.Filter):
    """Drops transformers' "right-padding was detected" warning: memory models read each row from its mask."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "right-padding was detected" not in record.getMessage()


@contextlib.contextmanager
def padding_handled() -> Iterator[None]:
    """Within HF `generate`, silence the advice to left-pad: any padding gives the unpadded row's tokens here."""
    generate_logger, quiet = logging.getLogger("transformers.generation.utils"), _RightPaddingWarning()
    generate_logger.addFilter(quiet)
    try:
        yield
    finally:
        generate_logger.removeFilter(quiet)


def check_generation_options(config: GenerationConfig, kwargs: dict[str, Any]) -> None:
    """Refuse, before any work, the `generate` options memory models do not support, naming the option."""
    works = "greedy or sampling decoding, beam search/sampling (`num_beams`), `num_return_sequences`"
    assisted = {
        "assistant_model": kwargs.get("assistant_model"),
        "prompt_lookup_num_tokens": config.prompt_lookup_num_tokens,
        "assistant_early_exit": config.assistant_early_exit,
        "use_mtp": getattr(config, "use_mtp", None) or None,
    }
    for name, value in assisted.items():
        if value is not None:
            raise ValueError(
                f"`{name}` (assisted / speculative decoding) is not supported with memory: candidate tokens would "
                f"have to be rolled back out of the memory state. What works: {works}."
            )
    for name in ("custom_generate", "output_attentions", "output_hidden_states"):
        if kwargs.get(name) or getattr(config, name, None):
            raise ValueError(f"`{name}` is not supported by memory models' `generate`. What works: {works}.")
    if config.cache_implementation is not None:
        raise ValueError(
            f"`cache_implementation={config.cache_implementation!r}` is not supported: memory models use their own "
            "generation cache (leave it unset)."
        )
    if getattr(config, "prefill_chunk_size", None) is not None:
        raise ValueError(
            f"`prefill_chunk_size={config.prefill_chunk_size}` is not supported: memory models already read the "
            "prompt a segment at a time, which bounds its memory the same way (leave it unset)."
        )
    mode = config.get_generation_mode()
    mode = getattr(mode, "value", mode)
    if mode not in WORKING_MODES:
        options = {
            "contrastive_search": "`penalty_alpha` with `top_k`",
            "dola_generation": "`dola_layers`",
            "group_beam_search": "`num_beam_groups`",
            "constrained_beam_search": "`constraints` / `force_words_ids`",
        }
        raise ValueError(f"{options.get(mode, mode)} ({mode}) is not supported with memory. What works: {works}.")


class MemoryGenerationCache:
    """Generation state (HF generate's cache): per group of rows, the memory of closed segments + the open segment's
    backbone cache.

    A row's tokens are the ones the attention mask marks, so padded prompts are read from each row's first real token.
    Rows whose segments close at the same decoding step form one batched group; a batch padded to other lengths
    splits into groups that decode side by side. HF's batch expansion (`num_return_sequences`, beams) and beam
    reordering go through `batch_repeat_interleave` and `reorder_cache`.
    """

    is_croppable = False  # HF generate capabilities: no rollback, no torch.compile of the decode step
    is_compileable = False
    # Not a linear (state-space) cache: generate slices the prompt by `get_seq_length` (read from transformers
    # 5.24 on).
    is_linear = (False,)

    def __init__(self, runtime: SegmentRuntime, state: MemoryState):
        self.runtime = runtime
        self.batch_size = state.batch_size
        start = MemoryState(state.method, state.tensors, state.segments_seen, extras=dict(state.extras))
        group = RowGroup(runtime, start, torch.arange(self.batch_size, device=_device(state)))
        if state.pending_length:  # tokens a `step` left in an open segment: read again with the prompt
            assert state.pending_ids is not None and state.pending_mask is not None
            group.unread = (state.pending_ids, state.pending_mask.long())
        else:
            empty = torch.zeros(self.batch_size, 0, dtype=torch.long, device=group.rows.device)
            group.unread = (empty, empty)
        self.groups = [group]
        self.tokens_read = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens of the sequence already read (HF generate slices new inputs with it)."""
        return self.tokens_read

    def memory_state(self) -> MemoryState:
        """The state after everything read so far; each row's open-segment tokens are pending (as after `step`)."""
        parts = [(g.rows, g.state) for g in self.groups]
        tensors = merge_rows(parts, self.batch_size)
        first = self.groups[0].state
        state = MemoryState(
            first.method, tensors, max(g.state.segments_seen for g in self.groups), extras=dict(first.extras)
        )
        opened = [(g.rows, *g.open_tokens()) for g in self.groups]
        width = max(int(mask.sum(1).max()) if mask.numel() else 0 for _, _, mask in opened)
        if width:
            device = opened[0][0].device
            state.pending_ids = torch.zeros(self.batch_size, width, dtype=torch.long, device=device)
            state.pending_mask = torch.zeros(self.batch_size, width, dtype=torch.long, device=device)
            for rows, ids, mask in opened:
                packing = Packing.of(mask)
                packed = packing.pack(ids)[:, :width]
                state.pending_ids[rows, : packed.shape[1]] = packed
                state.pending_mask[rows, : packed.shape[1]] = packing.packed_mask[:, :width]
        return state

    @torch.no_grad()
    def read(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Read new tokens `[B, n]` (mask 0: padding, skipped); returns the logits of each row's last token
        `[B, 1, V]`."""
        self.tokens_read += ids.shape[1]
        groups: list[RowGroup] = []
        outputs: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        for group in self.groups:
            rows_ids, rows_mask = ids[group.rows], mask[group.rows]
            if group.unread is None and bool(rows_mask.bool().all()):  # aligned rows: extend the open segment
                groups.append(group)
                outputs.append((group.rows, group.read(rows_ids, rows_mask)))
                continue
            for sub, logits in self._regroup(group, rows_ids, rows_mask):
                groups.append(sub)
                outputs.append((sub.rows, logits))
        self.groups = groups
        read = [(rows, logits) for rows, logits in outputs if logits is not None]
        if not read:
            raise ValueError("Every row of the input is padding (attention_mask all 0) and no earlier token was read.")
        like = read[0][1]
        out = like.new_zeros(self.batch_size, 1, like.shape[-1])  # a row with no token at all keeps zero logits
        for rows, logits in read:
            out[rows] = logits
        return out

    def _regroup(
        self, group: RowGroup, ids: torch.Tensor, mask: torch.Tensor
    ) -> list[tuple[RowGroup, torch.Tensor | None]]:
        """Read `group`'s open tokens again with the new ones, splitting its rows by where their segments close."""
        before_ids, before_mask = group.open_tokens()
        packing = Packing.of(torch.cat([before_mask.long(), mask.long()], dim=1))
        packed, counts = packing.pack(torch.cat([before_ids, ids], dim=1)), packing.counts
        out = []
        length = self.runtime.config.segment_length
        offsets = counts - closed_part(counts, length)
        for offset in torch.unique(offsets).tolist():
            local = (offsets == offset).nonzero().squeeze(1)
            sub = RowGroup(self.runtime, select_rows(group.state, local), group.rows[local])
            stream_ids, stream_mask = align_ends(packed[local], counts[local], length)
            out.append((sub, sub.read(stream_ids, stream_mask) if stream_ids.shape[1] else None))
        return out

    # ---- HF batch hooks (num_return_sequences, beam search) ---------------------------------------------------

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row `repeats` times in place (row r becomes rows r*repeats ... r*repeats + repeats - 1)."""
        groups = []
        for group in self.groups:
            local = torch.arange(len(group.rows), device=group.rows.device).repeat_interleave(repeats)
            rows = (group.rows[:, None] * repeats + torch.arange(repeats, device=group.rows.device)).reshape(-1)
            groups.append(group.select(local, rows))
        self.groups = groups
        self.batch_size *= repeats

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Row r continues from row `beam_idx[r]` (beam search); moved rows read their open segment again."""
        beam_idx = beam_idx.to(self.groups[0].rows.device)
        owner = torch.empty(self.batch_size, dtype=torch.long, device=beam_idx.device)
        local = torch.empty_like(owner)
        for n, group in enumerate(self.groups):
            owner[group.rows] = n
            local[group.rows] = torch.arange(len(group.rows), device=beam_idx.device)
        groups = []
        for n, group in enumerate(self.groups):
            rows = (owner[beam_idx] == n).nonzero().squeeze(1)
            if len(rows) == 0:
                continue
            source = local[beam_idx[rows]]
            if torch.equal(rows, group.rows) and torch.equal(source, torch.arange(len(rows), device=rows.device)):
                groups.append(group)
            else:
                groups.append(group.select(source, rows))
        self.groups = groups


def _device(state: MemoryState) -> torch.device:
    for t in state.tensors.values():
        return t.device
    return state.pending_ids.device if state.pending_ids is not None else torch.device("cpu")


class RowGroup:
    """Rows whose segments close at the same decoding step: their memory state and the open segment's cache."""

    def __init__(self, runtime: SegmentRuntime, state: MemoryState, rows: torch.Tensor):
        self.runtime = runtime
        self.state = state
        self.rows = rows  # [g] the group's rows in the batch
        self.open: OpenSegment | None = None
        self.unread: tuple[torch.Tensor, torch.Tensor] | None = None  # open-segment tokens no cache holds (read again)

    def open_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`(ids, mask)` of the open segment's tokens so far."""
        if self.unread is not None:
            return self.unread
        if self.open is not None:
            return self.open.ids, self.open.mask
        empty = torch.zeros(len(self.rows), 0, dtype=torch.long, device=self.rows.device)
        return empty, empty

    def select(self, local: torch.Tensor, rows: torch.Tensor) -> RowGroup:
        """A group of rows `rows` whose row j continues this group's row `local[j]`; its open segment is read again."""
        ids, mask = self.open_tokens()
        group = RowGroup(self.runtime, select_rows(self.state, local), rows)
        group.unread = (ids[local], mask[local])
        return group

    def read(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Read new tokens `[g, n]`; returns the logits of the last one, `[g, 1, V]` (the segment engine decides how:
        `open_segment.read_open`)."""
        logits, self.open, self.state = read_open(self.runtime, self.open, ids, mask, self.state)
        return logits
