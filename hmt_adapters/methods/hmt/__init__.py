"""HMT (Hierarchical Memory Transformer): sensory memory, memory embeddings and retrieval over cached memories."""

from ...registry import register_method
from .config import HMTConfig
from .method import HMT

register_method("hmt", config_cls=HMTConfig, method_cls=HMT)

__all__ = ["HMT", "HMTConfig"]
