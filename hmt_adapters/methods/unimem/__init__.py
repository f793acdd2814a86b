"""UniMem K/V memory methods (Transformer-XL, ...) as presets of one `UniMemConfig`."""

from ...registry import register_method
from .config import UniMemConfig
from .method import UniMem

register_method("transformer_xl", config_cls=UniMemConfig, method_cls=UniMem, defaults={"preset": "transformer_xl"})

__all__ = ["UniMem", "UniMemConfig"]
