"""Saved-tensor hooks that move a segment's activations to CPU memory, leaving parameters where they are.

`torch.autograd.graph.save_on_cpu` also packs tensors autograd saves because they are *weights* (a linear layer keeps
its weight for the input gradient), which would copy the whole model to the host every segment. These hooks skip
parameters (and views of them), tensors already on the CPU and tensors too small to matter.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


MIN_OFFLOAD_BYTES = 1 << 14  # smaller saved tensors stay in place: copying them costs more than it saves


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class ActivationOffload:
    """Context manager: inside it, autograd stores large non-parameter activations in (pinned) CPU memory."""

    def __init__(self, modules: Iterable[nn.Module], min_bytes: int | None = None):
        self.param_ptrs = {_storage_ptr(p) for m in modules for p in m.parameters()}
        self.min_bytes = MIN_OFFLOAD_BYTES if min_bytes is None else min_bytes
        self.bytes_offloaded = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, t: torch.Tensor):
        if (
            t.device.type == "cpu"
            or t.numel() * t.element_size() < self.min_bytes
            or _storage_ptr(t) in self.param_ptrs
        ):
            return t
        cuda = t.device.type == "cuda"
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=cuda)
        host.copy_(t, non_blocking=cuda)
        self.bytes_offloaded += host.numel() * host.element_size()
        return (t.device, host)

    @staticmethod
    def _unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=True)

    def __enter__(self) -> "ActivationOffload":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

