"""RMT (Recurrent Memory Transformer), the input-level baseline of HMT."""

from ...registry import register_method
from .config import RMTConfig
from .method import RMT

register_method("rmt", config_cls=RMTConfig, method_cls=RMT)

__all__ = ["RMT", "RMTConfig"]
