"""Building blocks shared by memory methods (UniMem's management, writing, reading and injection roles)."""

from .retrieval import MemoryRetrieval
from .tokens import RecurrentTokens, append_tail, learned_tokens, newest_or_init, push_fifo, trim_empty_columns

__all__ = [
    "MemoryRetrieval",
    "RecurrentTokens",
    "append_tail",
    "learned_tokens",
    "newest_or_init",
    "push_fifo",
    "trim_empty_columns",
]
