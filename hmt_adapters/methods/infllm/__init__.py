"""InfLLM (Xiao et al. 2024): training-free block retrieval over a frozen model (docs/infllm.md)."""

from ...registry import register_method
from .config import InfLLMConfig
from .method import InfLLM

register_method(
    "infllm",
    config_cls=InfLLMConfig,
    method_cls=InfLLM,
    untrained=(
        "no trainable parameters (training-free by design, InfLLM): every layer reads 128 sinks, the local window"
        " and the top-16 blocks of 128 past tokens by representative keys, at a fixed distance"
    ),
)

__all__ = ["InfLLM", "InfLLMConfig"]
