"""RMT (Recurrent Memory Transformer), the input-level baseline of HMT."""

from ...registry import register_method
from .config import RMTConfig
from .method import RMT

register_method(
    "rmt",
    config_cls=RMTConfig,
    method_cls=RMT,
    untrained=(
        "untrained: one random memory embedding, then the last layer's output fed back as an input embedding; "
        "nothing in it was trained to hold a fact, so in effect a one-segment window"
    ),
)

__all__ = ["RMT", "RMTConfig"]
