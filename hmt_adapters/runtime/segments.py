"""The segment-recurrent runtime: split inputs into segments, run the method on each, accumulate the loss.

It knows no method by name: it calls `plan`, `prepare` and `update` of a `MemoryMethod` and handles what every
method shares (segmenting, padding rows, truncated BPTT, activation offload, per-segment checkpointing, the
cross-segment next-token loss). A segment whose targets are all ignored and whose logits are not kept gets no LM
head and no cross-entropy: under last-segment loss (the HMT reference's protocol) only the supervised segments pay
for the vocabulary projection, with the same loss and gradients (an ignored target contributes exactly zero).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..attention import MEMORY_KWARG
from ..backbones import BackboneAdapter
from ..method import Layout, MemoryMethod, Segment, State
from ..state import MemoryState
from . import progress
from .offload import ActivationOffload

IGNORE_INDEX = -100
# Runtimes whose memory is off in the current thread / task (`SegmentRuntime.memory_disabled`): a per-call switch, so
# another thread's calls on the same model keep their memory.
_MEMORY_OFF: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("hmt_memory_off", default=frozenset())


def segment_spans(length: int, segment_length: int) -> list[tuple[int, int]]:
    """`[start, end)` of each segment of a `length`-token input; the last one may be shorter."""
    return [(s, min(s + segment_length, length)) for s in range(0, length, segment_length)]


def closed_part(tokens, segment_length: int):
    """The closing rule, one place for every reader (forward, streaming, generation): of `tokens` (an int or a
    tensor of per-row counts) the first `closed_part` fill whole segments and are folded into memory; the rest stays
    in the open segment until it fills."""
    return tokens // segment_length * segment_length


def shift_targets(labels: torch.Tensor) -> torch.Tensor:
    """Next-token targets over the whole input: position t predicts `labels[t + 1]`; the last has none."""
    pad = labels.new_full((labels.shape[0], 1), IGNORE_INDEX)
    return torch.cat([labels[:, 1:], pad], dim=1)


def supervised_segments(targets: torch.Tensor | None, spans: list[tuple[int, int]]) -> list[bool]:
    """For each span, whether any row has a target there (one host sync for all segments)."""
    if targets is None:
        return [False] * len(spans)
    hits = (targets != IGNORE_INDEX).any(dim=0).long().cumsum(0)
    hits = torch.cat([hits.new_zeros(1), hits])  # hits[t]: positions before t with a target
    starts, ends = (torch.tensor(edge, device=targets.device) for edge in zip(*spans))
    return (hits[ends] > hits[starts]).tolist()


def resolve_keep_logits(
    return_logits: bool | None, training: bool, has_labels: bool, num_items_in_batch: object
) -> bool:
    """`return_logits=None`: keep logits except in a trainer's training step, which reads only the loss.

    A training step is recognised by what the HF `Trainer` passes there: labels and `num_items_in_batch`, in train
    mode with gradients on. Evaluation (no gradients) and plain forwards keep them; True/False are obeyed as given.
    """
    if return_logits is not None:
        return bool(return_logits)
    return not (training and torch.is_grad_enabled() and has_labels and num_items_in_batch is not None)


def keep_rows(rows: torch.Tensor, new: State, old: State) -> State:
    """`new` for rows where `rows` is True, `old` elsewhere (rows without real tokens keep their state)."""
    if bool(rows.all()):
        return new
    out = {}
    for name, value in new.items():
        cond = rows.view(-1, *([1] * (value.dim() - 1)))
        out[name] = torch.where(cond, value, old[name])
    return out


class SegmentRows:
    """Each segment's rows `[B, e - s, ...]` (logits or hidden states) joined along time into `[B, T, ...]`.

    Without gradients they are copied into one tensor allocated at the first segment, so each segment's own tensor is
    freed (and its memory reused) as soon as it is copied: kept as a list and concatenated at the end, a 16-segment
    forward held every segment's logits and then a second copy of them all (268 MB each at 8k tokens and a vocabulary
    of 8k), and the fresh pages of both cost more than the LM head (docs/cost.md, "Logits of a long input").
    With gradients enabled (decided when the run starts) the list is concatenated, so the backward reaches each
    segment.
    """

    def __init__(self, total: int):
        self.total = total
        self.concatenate = torch.is_grad_enabled()
        self.parts: list[torch.Tensor] = []
        self.out: torch.Tensor | None = None

    def add(self, start: int, rows: torch.Tensor) -> None:
        if self.concatenate:
            self.parts.append(rows)
            return
        if self.out is None:
            self.out = rows.new_empty(rows.shape[0], self.total, *rows.shape[2:])
        self.out[:, start : start + rows.shape[1]] = rows

    def joined(self) -> torch.Tensor | None:
        """The rows joined, or None when no segment added any (`run(logits_from=T)`: no column has logits)."""
        if self.concatenate:
            return torch.cat(self.parts, dim=1) if self.parts else None
        return self.out


@dataclass
class RunResult:
    loss_sum: torch.Tensor  # fp32 scalar: summed cross-entropy
    num_tokens: torch.Tensor  # int64 scalar: targets that entered the sum
    logits: torch.Tensor | None  # [B, T, V]; with `keep_hidden`, the LM head's input `[B, T, d]` instead
    state: MemoryState


class SegmentRuntime:
    """Runs a `MemoryMethod` over the segments of an input."""

    # The saved-tensor hooks of `offload_activations` (`model.runtime.offload_class`: a subclass can meter them, as
    # benchmarks/training_memory.py does on a CPU, where nothing moves)
    offload_class: type[ActivationOffload] = ActivationOffload

    def __init__(self, method: MemoryMethod, backbone: BackboneAdapter):
        self.method = method
        self.backbone = backbone

    @property
    def memory_enabled(self) -> bool:
        """False inside `memory_disabled()` in this thread / task, True everywhere else."""
        return id(self) not in _MEMORY_OFF.get()

    @contextlib.contextmanager
    def memory_disabled(self) -> Iterator[None]:
        """Every segment read inside runs the backbone alone (no memory read, none written), in this thread only."""
        with progress.marked(_MEMORY_OFF, self):
            yield

    @property
    def config(self):
        return self.method.config

    def run(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        targets: torch.Tensor | None,
        state: MemoryState,
        *,
        keep_logits: bool = True,
        close_last: bool = True,
        keep_hidden: bool = False,
        logits_from: int = 0,
    ) -> RunResult:
        """Process `input_ids` `[B, T]` segment by segment starting from `state`.

        With `keep_logits=False`, segments without a target run no LM head and no cross-entropy. With
        `close_last=False` a final segment shorter than `segment_length` stays open: its logits are returned but it is
        not folded into the state (streaming keeps those tokens pending). With `keep_hidden=True` (and no `targets`)
        the result's `logits` are the tensors the LM head reads, one row per token (a fused LM head applies it).
        `logits_from=k` runs no LM head over the first k columns (read again only to rebuild their segment, as a
        stream's pending tokens are): the logits are `[B, T - k, V]` (None for k = T) and those columns take no
        target.
        """
        if keep_hidden and (targets is not None or not keep_logits):
            raise ValueError("`keep_hidden=True` returns the LM head's inputs: it takes no targets, keeps every row.")
        if not 0 <= logits_from <= input_ids.shape[1]:
            raise ValueError(f"`logits_from` must be in [0, {input_ids.shape[1]}] (the columns), got {logits_from}.")
        if targets is not None and logits_from and bool((targets[:, :logits_from] != IGNORE_INDEX).any()):
            raise ValueError(f"`logits_from={logits_from}` runs no LM head over columns that have targets.")
        cfg = self.config
        length = cfg.segment_length
        spans = segment_spans(input_ids.shape[1], length)
        tensors = state.tensors
        grad = torch.is_grad_enabled()
        per_segment_plan = cfg.gradient_checkpointing and grad
        plans = [None] * len(spans)
        if self.memory_enabled and not per_segment_plan:
            segments = [
                Segment(input_ids[:, s:e], attention_mask[:, s:e], state.segments_seen + n, None)
                for n, (s, e) in enumerate(spans)
            ]
            with self._offload() if cfg.offload_activations and grad else contextlib.nullcontext():
                plans = self.method.plan(segments, tensors)
        loss_sum = torch.zeros((), device=input_ids.device)
        num_tokens = torch.zeros((), device=input_ids.device, dtype=torch.long)
        logits = SegmentRows(input_ids.shape[1] - logits_from) if keep_logits else None
        closed = 0
        supervised = supervised_segments(targets, spans)
        if targets is not None and not any(supervised):
            supervised[-1] = True  # no target anywhere: the loss is 0 but must stay in the graph (backward works)
        for n, (s, e) in enumerate(spans):
            index = state.segments_seen + n
            closes = close_last or (e - s) == length
            if cfg.bptt_depth is not None and index > 0 and index % cfg.bptt_depth == 0:
                tensors = {k: v.detach() for k, v in tensors.items()}
            seg_targets = targets[:, s:e] if targets is not None and supervised[n] else None
            args = (
                input_ids[:, s:e],
                attention_mask[:, s:e],
                seg_targets,
                tensors,
                index,
                plans[n],
                closes,
                keep_logits,
                keep_hidden,
                max(0, logits_from - s),
            )
            if cfg.gradient_checkpointing and grad:
                ce, count, seg_logits, tensors = checkpoint(self._segment, *args, use_reentrant=False)
            elif cfg.offload_activations and grad:
                with self._offload():
                    ce, count, seg_logits, tensors = self._segment(*args)
            else:
                ce, count, seg_logits, tensors = self._segment(*args)
            loss_sum = loss_sum + ce
            num_tokens = num_tokens + count
            closed += int(closes)
            progress.advance(e - s)
            if logits is not None and seg_logits is not None:
                logits.add(max(s, logits_from) - logits_from, seg_logits)
        new_state = MemoryState(state.method, tensors, state.segments_seen + closed, extras=dict(state.extras))
        return RunResult(loss_sum, num_tokens, logits.joined() if logits is not None else None, new_state)

    def _offload(self) -> ActivationOffload:
        return self.offload_class([self.backbone.model, self.method])

    def _segment(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        targets: torch.Tensor | None,
        tensors: State,
        index: int,
        plan,
        closes: bool,
        keep_logits: bool,
        keep_hidden: bool = False,
        skip: int = 0,
    ):
        """One segment: assemble the window, run the backbone, score the tokens, write the new state.

        `targets=None` means no target in this segment: the LM head then runs only when the logits are kept.
        `keep_hidden` returns the token slots' hidden states (the LM head's input) in place of the logits.
        `skip` leading tokens get neither (no target there: `run`'s `logits_from`); no logits if it covers them all.
        """
        if targets is None and not keep_logits and not (self.memory_enabled and closes):
            return torch.zeros((), device=ids.device), ids.new_zeros(()), None, tensors  # nothing reads this segment
        segment = Segment(ids, mask, index, self.backbone.embed(ids), closes)
        if self.memory_enabled:
            if plan is None:
                plan = self.method.plan([segment], tensors)[0]
            layout = self.method.prepare(segment, tensors, plan)
        else:
            layout = Layout()
        window, window_mask = self.assemble(segment, layout)
        extra = {} if layout.attention is None else {MEMORY_KWARG: layout.attention}
        hidden = self.backbone.body(window, window_mask, **extra)
        start = layout.prefix_length
        logits = None
        if skip >= ids.shape[1]:
            targets = None  # every column skipped: none of them has a target (checked in `run`)
        elif keep_hidden:
            logits = hidden[:, start + skip : start + ids.shape[1]]
        elif targets is not None or keep_logits:
            logits = self.backbone.logits(hidden[:, start + skip : start + ids.shape[1]])
            targets = None if targets is None else targets[:, skip:]
        if targets is None:
            ce, count = hidden.new_zeros((), dtype=torch.float32), ids.new_zeros(())
        else:
            flat = targets.reshape(-1)
            assert logits is not None  # computed above whenever there are targets
            ce = F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), flat, ignore_index=IGNORE_INDEX, reduction="sum"
            )
            count = (flat != IGNORE_INDEX).sum()
        new = tensors
        if self.memory_enabled and closes:
            new = self.method.update(segment, tensors, layout, hidden)
            if not self.method.updates_empty_rows:
                new = keep_rows(segment.real_rows, new, tensors)
        return ce, count, logits if keep_logits else None, new

    def assemble(self, segment: Segment, layout: Layout, suffix: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """`[prefix ; token embeddings ; suffix]` and its mask; rows with no real token attend everywhere (no NaN).

        `suffix=False` leaves the suffix out (an open segment during generation gets it only when it closes).
        """
        assert segment.embeds is not None  # set for every segment that is read
        parts = [segment.embeds]
        masks = [segment.mask]
        if layout.prefix is not None and layout.prefix_mask is not None:
            parts.insert(0, layout.prefix.to(segment.embeds.dtype))
            masks.insert(0, layout.prefix_mask.to(segment.mask.dtype))
        if suffix and layout.suffix is not None and layout.suffix_mask is not None:
            parts.append(layout.suffix.to(segment.embeds.dtype))
            masks.append(layout.suffix_mask.to(segment.mask.dtype))
        window = torch.cat(parts, dim=1)
        mask = torch.cat(masks, dim=1)
        self.backbone.check_mask(mask)
        empty = ~segment.real_rows
        if bool(empty.any()):
            mask = torch.where(empty[:, None], torch.ones_like(mask), mask)
        return window, mask
