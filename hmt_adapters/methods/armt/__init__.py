"""ARMT's associative memory (Rodkin et al. 2024): a matrix memory per layer, read as a residual, written by the delta
rule from every token of a segment."""

from ...registry import register_method
from .config import ARMTConfig
from .method import ARMT

register_method(
    "armt",
    config_cls=ARMTConfig,
    method_cls=ARMT,
    untrained=(
        "untrained: the read's output projection starts at zero, so the wrapped model is the bare backbone until "
        "it is trained (the memory is written, nothing reads it)"
    ),
)

__all__ = ["ARMT", "ARMTConfig"]
