"""MELODI: multi-layer short-term compression and a long-term memory layer (Chen et al., ICLR 2025)."""

from ...registry import register_method
from .config import MelodiConfig
from .method import Melodi

register_method(
    "melodi",
    config_cls=MelodiConfig,
    method_cls=Melodi,
    untrained=(
        "untrained: 64 random summary embeddings per segment (identity mixers), long-term store of 32 average-"
        "pooled middle-layer states per segment read through a gate at sigmoid = 0.1"
    ),
)

__all__ = ["Melodi", "MelodiConfig"]
