"""`RMTConfig`: the Recurrent Memory Transformer (Bulatov et al. 2022), HMT's baseline."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...config import MemoryConfig


@dataclass
class RMTConfig(MemoryConfig):
    """Memory embeddings read before each segment and written after it.

    Args:
        num_memory_tokens (`int`, defaults to 1):
            Memory embeddings per segment (`m`). The HMT paper's RMT baseline uses 1; 0 disables memory.
    """

    method = "rmt"

    num_memory_tokens: int = field(default=1, metadata={"help": "Memory embeddings per segment.", "min": 0})
