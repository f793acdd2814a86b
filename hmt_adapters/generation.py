"""Generation with memory through transformers' own `generate`.

`MemoryGenerationCache` is the `past_key_values` HF generate carries from step to step. It holds the memory state of
the closed segments and the backbone's own cache of the open segment, so decoding reads one token per step inside
the open segment; when a segment fills up it is folded into memory with the exact training-time segment step and a
new segment opens. Prompts of any length are read segment by segment, a bounded number at a time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .backbones import positions_from_mask
from .method import Layout, Segment
from .outputs import MemoryState
from .runtime import MEMORY_KWARG

if TYPE_CHECKING:
    from .model import MemoryModel

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


class MemoryGenerationCache:
    """Generation state: memory of closed segments + the open segment's backbone cache (HF `past_key_values`)."""

    is_croppable = False  # HF generate capabilities: no rollback, no torch.compile of the decode step
    is_compileable = False

    def __init__(self, model: "MemoryModel", state: MemoryState):
        self.model = model
        self.state = MemoryState(state.method, state.tensors, state.segments_seen, extras=dict(state.extras))
        self.open: OpenSegment | None = None
        self.tokens_read = 0
        if state.pending_length:  # tokens a `step` left in an open segment: reopen it (not part of HF's sequence)
            self.read(state.pending_ids, state.pending_mask)
        self.tokens_read = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens of the sequence already read (HF generate slices new inputs with it)."""
        return self.tokens_read

    def memory_state(self) -> MemoryState:
        """The state after everything read so far; the open segment's tokens are pending (as after `step`)."""
        state = MemoryState(self.state.method, self.state.tensors, self.state.segments_seen, extras=dict(self.state.extras))
        if self.open is not None and self.open.ids.shape[1]:
            state.pending_ids, state.pending_mask = self.open.ids, self.open.mask
        return state

    @property
    def segment_length(self) -> int:
        return self.model.memory_config.segment_length

    @torch.no_grad()
    def read(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Read new tokens `[B, n]`; returns the logits of the last one, `[B, 1, V]`."""
        self.tokens_read += ids.shape[1]
        if self.open is not None:
            ids = torch.cat([self.open.ids, ids], dim=1)
            mask = torch.cat([self.open.mask, mask], dim=1)
            if not self._can_append(ids.shape[1] - self.open.ids.shape[1]):
                self.open = None
        full = (ids.shape[1] // self.segment_length) * self.segment_length
        if full and full == ids.shape[1]:
            self._close(ids[:, : full - self.segment_length], mask[:, : full - self.segment_length])
            return self._fold_last(ids[:, full - self.segment_length :], mask[:, full - self.segment_length :])
        if full:  # an empty close would drop the open segment's cache and re-read it for every new token
            self._close(ids[:, :full], mask[:, :full])
        return self._extend(ids[:, full:], mask[:, full:])

    # ---- closed segments -------------------------------------------------------------------------------------

    def _close(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Fold whole segments into memory, `PREFILL_SEGMENTS` at a time, keeping no logits."""
        self.open = None
        step = PREFILL_SEGMENTS * self.segment_length
        for start in range(0, ids.shape[1], step):
            end = start + step
            self.state = self.model.runtime.run(ids[:, start:end], mask[:, start:end], None, self.state, keep_logits=False).state

    def _fold_last(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Close one full segment and return its last logits (the prediction of the next segment's first token)."""
        self.open = None
        result = self.model.runtime.run(ids, mask, None, self.state)
        self.state = result.state
        return result.logits[:, -1:]

    # ---- the open segment ------------------------------------------------------------------------------------

    def _can_append(self, new: int) -> bool:
        """Whether `new` tokens can go through the open segment's cache, or the segment must be read again.

        Again when the family cannot continue a cache (with several tokens), or when the layout was prepared from fewer
        tokens than the method needs for an exact one (HMT's paper query: the first j tokens).
        """
        adapter = self.model.adapter
        if not adapter.continues_cache or (new > 1 and not adapter.continues_multi_token):
            return False
        return self.open.prepared_with >= self.model.memory.layout_fixed_after()

    def _extend(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Feed the open segment's tokens `[B, r]` (all of them when it is (re)opened, else the new ones)."""
        adapter, method = self.model.adapter, self.model.memory
        if self.open is None:
            segment = Segment(ids, mask, self.state.segments_seen, adapter.embed(ids), closes=False)
            layout = method.prepare(segment, self.state.tensors, method.plan([segment], self.state.tensors)[0])
            if layout.attention is not None:  # records feed `update`, and a segment is read again when it closes
                layout.attention.record_layers = frozenset()
            window, window_mask = self.model.runtime.assemble(segment, layout, suffix=False)
            self.open = OpenSegment(ids[:, :0], mask[:, :0], layout, window_mask[:, :0], None, ids.shape[1])
            new_embeds, new_mask = window, window_mask
        else:
            fresh = ids.shape[1] - self.open.ids.shape[1]
            new_embeds, new_mask = adapter.embed(ids[:, -fresh:]), mask[:, -fresh:]
        open_ = self.open
        window_mask = torch.cat([open_.window_mask, new_mask.to(open_.window_mask.dtype)], dim=1)
        positions = positions_from_mask(window_mask)[:, -new_embeds.shape[1] :]
        extra = {} if open_.layout.attention is None else {MEMORY_KWARG: open_.layout.attention}
        hidden, cache = adapter.body_cached(new_embeds, window_mask, positions, open_.cache, **extra)
        self.open = OpenSegment(ids, mask, open_.layout, window_mask, cache, open_.prepared_with)
        return adapter.logits(hidden[:, -1:])
