"""The output of a forward pass: `MemoryCausalLMOutput`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from .state import MemoryState


@dataclass
class MemoryCausalLMOutput(CausalLMOutputWithPast):
    """`CausalLMOutputWithPast` plus the memory state after the call.

    Args:
        loss (`torch.FloatTensor` of shape `()`, *optional*):
            Causal-LM loss over the whole input (the last position of segment n predicts the first token of n+1).
        logits (`torch.FloatTensor` of shape `(batch_size, sequence_length, vocab_size)`):
            One row per input token; none for memory, sensory or summary slots.
        memory_state (`MemoryState`, *optional*):
            The state after the last segment (returned by `step`).

    `num_tokens` (`torch.LongTensor` of shape `()`, or None without labels), the targets that entered the loss, is an
    attribute, not an output entry: the `Trainer` hands every entry but the loss to `compute_metrics`, which then gets
    the logits alone, as from any causal LM (`with_num_tokens`).
    """

    memory_state: MemoryState | None = None
    num_tokens: ClassVar[torch.Tensor | None] = None  # set per instance by `with_num_tokens`; not a dataclass field

    def with_num_tokens(self, num_tokens: torch.Tensor | None) -> MemoryCausalLMOutput:
        """This output with `num_tokens` set (outside the output's entries, see the class docstring)."""
        object.__setattr__(self, "num_tokens", num_tokens)
        return self
