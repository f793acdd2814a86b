"""InfLLM (Xiao et al. 2024): training-free block retrieval over a frozen model (docs/infllm.md)."""

from ...registry import register_method
from .config import InfLLMConfig
from .method import InfLLM

register_method(
    "infllm",
    config_cls=InfLLMConfig,
    method_cls=InfLLM,
    untrained=(
        "no trainable parameters (training-free): every layer reads 128 sinks, the local window and the block of"
        " 128 past tokens (with its neighbours) sharing the most rare words with the chunk's last tokens, in"
        " document order"
    ),
)

__all__ = ["InfLLM", "InfLLMConfig"]
