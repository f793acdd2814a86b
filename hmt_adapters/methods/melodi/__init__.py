"""MELODI: multi-layer short-term compression and a long-term memory layer (Chen et al., ICLR 2025)."""

from ...registry import register_method
from .config import MelodiConfig
from .method import Melodi

register_method("melodi", config_cls=MelodiConfig, method_cls=Melodi)

__all__ = ["Melodi", "MelodiConfig"]
