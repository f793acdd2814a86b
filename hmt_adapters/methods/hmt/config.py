"""`HMTConfig`: the Hierarchical Memory Transformer (He et al., NAACL 2025)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...config import MemoryConfig

QUERY_SOURCES = ("previous_suffix", "segment_prefix")


@dataclass
class HMTConfig(MemoryConfig):
    """Sensory memory, a memorization prompt and retrieval over the last N memory embeddings.

    Args:
        sensory_length (`int`, defaults to 32):
            `k`: token embeddings of the previous segment's last k tokens, prepended to each segment (HMT App. D).
        summary_length (`int`, *optional*):
            `j`: tokens summarised for the retrieval query; defaults to `segment_length // 2` (HMT App. D).
        memory_window (`int`, defaults to 300):
            `N`: cached memory embeddings that retrieval searches (HMT App. D: 300 for OPT, SmolLM, Llama-class).
        retrieval_dim (`int`, *optional*):
            `d_h`: width of the retrieval projections W_q, W_k; defaults to the embedding width.
        use_retrieval (`bool`, defaults to `True`):
            False is HMT's training stage 1: the previous memory embedding is the prompt, no T, W_q or W_k.
        query_source (`str`, defaults to `"previous_suffix"`):
            Where the retrieval query comes from. `"previous_suffix"` (causal, the default) summarises the last j
            tokens of the previous segment. `"segment_prefix"` is the paper's query: the first j tokens of the
            current segment, which lets a segment's early tokens depend on later ones (a within-segment leak).
    """

    method = "hmt"

    sensory_length: int = field(default=32, metadata={"help": "Sensory tokens k.", "min": 0})
    summary_length: int | None = field(
        default=None, metadata={"help": "Summary tokens j (default segment_length // 2).", "min": 1, "nullable": True}
    )
    memory_window: int = field(default=300, metadata={"help": "Cached memory embeddings N.", "min": 1})
    retrieval_dim: int | None = field(
        default=None, metadata={"help": "Retrieval width d_h (default: embedding width).", "min": 1, "nullable": True}
    )
    use_retrieval: bool = field(default=True, metadata={"help": "False = HMT stage 1 (no retrieval)."})
    query_source: str = field(
        default="previous_suffix",
        metadata={
            "help": "Retrieval query: causal previous suffix or the paper's segment prefix.",
            "choices": QUERY_SOURCES,
        },
    )

    @classmethod
    def cover_fields(cls, tokens: int, segment_length: int) -> dict[str, Any]:
        """Enough past memory embeddings retrieval reads for every segment of `tokens` (at least 300)."""
        return {"memory_window": max(math.ceil(tokens / segment_length), 300)}

    def validate(self) -> None:
        super().validate()
        if self.summary_length is not None and self.summary_length > self.segment_length:
            raise ValueError(
                f"`summary_length` must be in [1, `segment_length`={self.segment_length}], got {self.summary_length}."
            )

    @property
    def summary_tokens(self) -> int:
        """`j` with its default applied."""
        return self.summary_length if self.summary_length is not None else max(1, self.segment_length // 2)
