"""`MelodiConfig`: MELODI, hierarchical short-term and long-term memory compression (Chen et al., ICLR 2025)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...config import MemoryConfig


@dataclass
class MelodiConfig(MemoryConfig):
    """Summary tokens per window, a recurrent short-term memory per layer and a long-term K/V store in one layer.

    `segment_length` is the context window `W`.

    Args:
        summary_length (`int`, *optional*):
            `S`: summary tokens appended to each window, also the short-term memory tokens per layer (`U = S`,
            MELODI §3.2). Defaults to `segment_length // 4` (the paper's `S128` at `W = 512`).
        long_term_length (`int`, *optional*):
            `L`: long-term tokens written per window (MELODI §3.3). Defaults to `segment_length // 8` (`L64` at
            `W = 512`, an 8x compression of the window).
        long_term_windows (`int`, defaults to 128):
            `Q_max`: windows the long-term FIFO keeps (`L * Q_max` key/value pairs; MELODI §4.2 uses 128).
        short_term_layers (`list[int]`, *optional*):
            0-based decoder layers with a short-term memory; `None` means every layer (the paper's main models).
        long_term_layer (`int`, *optional*):
            The one decoder layer with the long-term memory; `None` means the middle layer (`num_layers // 2`).
        use_short_term (`bool`, defaults to `True`):
            False is the long-term-only ablation: no short-term prefix and no memory mixers.
        use_long_term (`bool`, defaults to `True`):
            False is the short-term-only ablation (MELODI Table 4, "ST only"): no long-term store or gate.
        gate_init (`float`, defaults to 0.1):
            Initial value of every head's gate `alpha = sigmoid(beta)` in (0, 1), the weight of the long-term
            cross-attention (MELODI §3.3; range and init are not in the paper, see docs/melodi.md).
    """

    method = "melodi"

    summary_length: int | None = field(
        default=None,
        metadata={"help": "Summary / short-term tokens S (default segment_length // 4).", "min": 1, "nullable": True},
    )
    long_term_length: int | None = field(
        default=None,
        metadata={"help": "Long-term tokens L per window (default segment_length // 8).", "min": 1, "nullable": True},
    )
    long_term_windows: int = field(
        default=128, metadata={"help": "Windows Q_max kept in the long-term FIFO.", "min": 1}
    )
    short_term_layers: tuple[int, ...] | None = field(
        default=None,
        metadata={
            "help": "Decoder layers with short-term memory (None = all).",
            "type": tuple,
            "min": 0,
            "nullable": True,
        },
    )
    long_term_layer: int | None = field(
        default=None,
        metadata={"help": "Decoder layer with long-term memory (None = middle).", "min": 0, "nullable": True},
    )
    use_short_term: bool = field(default=True, metadata={"help": "Short-term memory on (False: long-term only)."})
    use_long_term: bool = field(default=True, metadata={"help": "Long-term memory on (False: short-term only)."})
    gate_init: float = field(
        default=0.1,
        metadata={"help": "Initial long-term gate alpha, in (0, 1).", "type": float, "min": 0.0, "max": 1.0},
    )

    @classmethod
    def cover_fields(cls, tokens: int, segment_length: int) -> dict[str, Any]:
        """Enough windows of long-term K/V kept for every segment of `tokens` (at least 128)."""
        return {"long_term_windows": max(math.ceil(tokens / segment_length), 128)}

    def validate(self) -> None:
        super().validate()
        if not (self.use_short_term or self.use_long_term):
            raise ValueError("At least one of `use_short_term` and `use_long_term` must be True, got both False.")
        if not 0.0 < self.gate_init < 1.0:
            raise ValueError(
                f"`gate_init` must lie strictly between 0 and 1 (it is a sigmoid), got {self.gate_init!r}."
            )

    @property
    def summary_tokens(self) -> int:
        """`S` with its default applied."""
        return self.summary_length if self.summary_length is not None else max(1, self.segment_length // 4)

    @property
    def long_term_tokens(self) -> int:
        """`L` with its default applied."""
        return self.long_term_length if self.long_term_length is not None else max(1, self.segment_length // 8)
