"""HMT (Hierarchical Memory Transformer): sensory memory, memory embeddings and retrieval over cached memories."""

from ...registry import register_method
from .config import HMTConfig
from .method import HMT

register_method(
    "hmt",
    config_cls=HMTConfig,
    method_cls=HMT,
    untrained=(
        "untrained: random memory/summary embeddings and random retrieval projections; the memory embedding is an"
        " untrained last-layer state, so in effect a window of one segment + 32 sensory tokens"
    ),
)

__all__ = ["HMT", "HMTConfig"]
