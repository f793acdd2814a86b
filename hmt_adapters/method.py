"""`MemoryMethod`: the interface between the segment runtime and one memory method.

Per segment the runtime asks the method for a `Layout` (input-level memory slots around the segment's tokens and,
for attention-level methods, the K/V memory the patched attention reads), runs the backbone once, and hands the
final hidden states back so the method can write its new state. Methods are pure: state in, new state out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .backbones import BackboneAdapter
from .config import MemoryConfig

State = dict[str, torch.Tensor]


@dataclass
class Segment:
    """One segment for every row: tokens `[B, L]`, their mask, and the number of segments closed before it."""

    ids: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L] 1 = real token
    index: int
    embeds: torch.Tensor | None  # [B, L, d] token embeddings (None when passed to `plan`)
    closes: bool = True  # False: a streaming segment that is still open (its state update is discarded)

    @property
    def real_rows(self) -> torch.Tensor:
        """`[B]` bool: rows with at least one real token (the others keep their state)."""
        return self.mask.bool().any(-1)


@dataclass
class Layout:
    """What surrounds a segment's tokens in the backbone call.

    The window is `[prefix ; tokens ; suffix]`; `attention` is the object the patched attention function reads
    (None for input-level methods).
    """

    prefix: torch.Tensor | None = None  # [B, P, d]
    prefix_mask: torch.Tensor | None = None  # [B, P]
    suffix: torch.Tensor | None = None  # [B, S, d]
    suffix_mask: torch.Tensor | None = None  # [B, S]
    attention: Any = None

    @property
    def prefix_length(self) -> int:
        return 0 if self.prefix is None else self.prefix.shape[1]


def value_kind(t: torch.Tensor) -> str:
    return "bool" if t.dtype == torch.bool else "floating" if t.is_floating_point() else "integer"


def compare_state(own: State, tensors: State, growing: dict[str, int] | None = None) -> list[str]:
    """Differences between a state `tensors` and the layout `own` (this method's): names present in one only,
    per-stream shapes (dims counted after the batch; the dim `growing[name]` may differ), kinds of values."""
    diffs = []
    for name in sorted(set(own) | set(tensors)):
        if name not in own or name not in tensors:
            diffs.append(f"tensor {name!r} only in the {'state' if name in tensors else 'model'}")
            continue
        got, want = list(tensors[name].shape[1:]), list(own[name].shape[1:])
        free = (growing or {}).get(name)
        if free is not None and len(got) == len(want):
            got[free - 1] = want[free - 1]
        if got != want:
            diffs.append(
                f"{name!r} per-stream shape {tuple(tensors[name].shape[1:])} (state) vs {tuple(want)} (model)"
            )
        elif value_kind(tensors[name]) != value_kind(own[name]):
            diffs.append(
                f"{name!r} holds {value_kind(tensors[name])} values (state) vs {value_kind(own[name])} (model)"
            )
    return diffs


class MemoryMethod(nn.Module):
    """Base class of every memory method; subclasses own the method's parameters and state layout."""

    config_class: ClassVar[type[MemoryConfig]] = MemoryConfig
    needs_attention: ClassVar[bool] = False  # injects K/V into attention layers (needs an attention backbone)
    # True: `update` itself handles rows without a real token (e.g. appends masked slots so that every row's store
    # keeps one layout); the runtime then does not put such rows back to their old state.
    updates_empty_rows: ClassVar[bool] = False
    # True: `update` reads nothing but what the segment's attention recorded (`layout.attention.records`) and the
    # segment itself, and is `write_records`. Generation then closes a segment decoded token by token from the
    # records its steps kept instead of reading it again (`runtime/open_segment.close`).
    writes_from_records: bool = False
    # True: `update` reads nothing but the window's final hidden states, its attention records, the segment's ids
    # and mask, and what the method's own layer hooks computed from the steps and the suffix (MELODI's mixers,
    # `closing_decoded`); no note a read leaves in its context, no embeddings. Generation then closes a decoded
    # segment by running only its suffix through the segment's cache, with the hidden states its steps computed,
    # instead of reading it again.
    writes_from_window: bool = False
    # the configuration fields that size `window_slots` (named when the slots alone fill the backbone's positions)
    window_slot_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: MemoryConfig, backbone: BackboneAdapter):
        super().__init__()
        self.config = config
        self.backbone = backbone

    def window_slots(self) -> int:
        """Extra positions a segment's window holds besides its `segment_length` tokens."""
        return 0

    def default_layers(self, rule: Callable[[int], Iterable[int]]) -> tuple[int, ...]:
        """The method's default memory layers: `rule(depth)` picks among the backbone's layers, or, in a hybrid
        (Jamba, Qwen3.5, Granite 4.0, ...), among its attention layers, the only ones memory can join (the 4th of
        them, not the 4th layer)."""
        layers = self.backbone.attention_layers
        return tuple(layers[i] for i in rule(len(layers)))

    def resolve_layers(self, field: str, layers) -> tuple[int, ...]:
        """`layers` sorted without repeats, or a `ValueError` naming `field` when one lies beyond the backbone's depth
        or has no attention (a hybrid's SSM layer)."""
        n = self.backbone.num_layers
        bad = sorted({i for i in layers if i >= n})
        if bad:
            raise ValueError(f"{field} must lie in [0, {n - 1}] for this {n}-layer backbone, got {bad}.")
        self.backbone.check_memory_layers(field, layers)
        return tuple(sorted(set(layers)))

    def check_backbone(self) -> None:
        """Raise `ValueError` when the method's windows do not fit the backbone's positions."""
        limit = self.backbone.max_positions
        slots = self.window_slots()
        window = self.config.segment_length + slots
        if limit is None or window <= limit:
            return
        problem = (
            f"A segment window of {window} positions (`segment_length`={self.config.segment_length} plus {slots} "
            f"memory slots) exceeds the backbone's {limit} positions (max_position_embeddings)"
        )
        if slots < limit:
            raise ValueError(f"{problem}; lower `segment_length` to at most {limit - slots}.")
        fields = " or ".join(f"`{name}`" for name in self.window_slot_fields)
        raise ValueError(f"{problem}: the memory slots alone fill them; lower {fields or 'the memory slots'}.")

    def layout_fixed_after(self) -> int:
        """Segment tokens after which `prepare` no longer depends on the segment's own tokens (0: never does)."""
        return 0

    def init_state(self, batch_size: int, device: torch.device, dtype: torch.dtype) -> State:
        """The state before the first segment."""
        return {}

    def state_differences(self, tensors: State, dtype: torch.dtype) -> list[str]:
        """How `tensors` differ from this method's states (names, per-stream shapes, kinds of values), in words; empty
        when they fit. A state's layout is `init_state`'s: every entry keeps its per-stream shape (methods whose
        store grows override this)."""
        return compare_state(self.init_state(1, torch.device("meta"), dtype), tensors)

    def plan(self, segments: list[Segment], state: State) -> list[Any]:
        """Work that depends only on tokens, done for many segments in one batched call (default: none)."""
        return [None] * len(segments)

    def prepare(self, segment: Segment, state: State, plan: Any) -> Layout:
        """The layout of `segment`'s backbone window."""
        return Layout()

    def update(self, segment: Segment, state: State, layout: Layout, hidden: torch.Tensor) -> State:
        """The state after `segment`, from the final hidden states of its whole window `[B, W, d]`."""
        return state

    def closing_decoded(self, segment: Segment, layout: Layout) -> None:
        """A segment decoded token by token is about to close from its steps (`writes_from_window`): its whole
        `segment` (ids and mask) is known, and its layout's suffix runs through the segment's cache next. A method
        whose layer hooks write from the suffix's pass (MELODI's mixers) gets ready for it here; default nothing."""

    def write_records(self, segment: Segment, state: State, layout: Layout) -> State:
        """The state after `segment` from its attention records alone (methods with `writes_from_records`)."""
        raise NotImplementedError(f"{type(self).__name__} writes its state from hidden states (`update`).")
