"""`SavableModel`: what saving reads of a model, so that `saving/` names the model without importing it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from torch import nn

from ..backbones import BackboneAdapter
from ..config import MemoryConfig


class SavableModel(Protocol):
    """What saving, loading, checkpoints and the model card read of a memory model (`MemoryModel` is one), named here
    so that `saving/` imports nothing above it (peft's `save_and_load` leaves its model untyped for the same reason).
    """

    base_model_prefix: str  # the backbone's key prefix in the model's state dict
    tokenizer: Any
    frozen_for_inference: bool
    loading_info: dict[str, list[str]]

    @property
    def method(self) -> str: ...
    @property
    def memory(self) -> nn.Module: ...
    @property
    def memory_config(self) -> MemoryConfig: ...
    @property
    def adapter(self) -> BackboneAdapter: ...
    @property
    def backbone(self) -> Any: ...  # any HF causal LM, peft-wrapped or not
    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]: ...
    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...
    def train(self, mode: bool = True) -> Any: ...
    def eval(self) -> Any: ...
