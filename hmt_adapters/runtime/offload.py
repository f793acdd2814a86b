"""Saved-tensor hooks that move a segment's activations to CPU memory, leaving parameters where they are.

`torch.autograd.graph.save_on_cpu` also packs tensors autograd saves because they are *weights* (a linear layer keeps
its weight for the input gradient), which would copy the whole model to the host every segment. These hooks skip
parameters, views of them and, under mixed precision, their casts: autocast casts fp32 weights to bf16/fp16 on every
use (frozen ones are not even cached), and a linear layer saves that cast. They also skip tensors already in host
memory and tensors too small to matter.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

MIN_OFFLOAD_BYTES = 1 << 14  # smaller saved tensors stay in place: copying them costs more than it saves
# autograd nodes of casts and views, followed from a saved tensor back to the parameter it was made from
_PARAM_PATH_NODES = (
    "ToCopyBackward0",
    "TBackward0",
    "TransposeBackward0",
    "PermuteBackward0",
    "ViewBackward0",
    "ExpandBackward0",
    "UnsafeViewBackward0",
)


def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class ActivationOffload:
    """Context manager: inside it, autograd stores large non-parameter activations in (pinned) CPU memory."""

    host_device_types: tuple[str, ...] = ("cpu",)  # tensors on these devices are in host memory already

    def __init__(self, modules: Iterable[nn.Module], min_bytes: int | None = None):
        params = [p for m in modules for p in m.parameters()]
        self.param_ptrs = {_storage_ptr(p) for p in params}
        self.param_dtypes: dict[tuple[int, ...], set[torch.dtype]] = {}
        for p in params:
            self.param_dtypes.setdefault(tuple(p.shape), set()).add(p.dtype)
        self.min_bytes = MIN_OFFLOAD_BYTES if min_bytes is None else min_bytes
        self.bytes_offloaded = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def is_parameter_cast(self, t: torch.Tensor) -> bool:
        """Whether `t` is a cast (or a view of a cast) of a parameter rather than an activation.

        In the graph (a trainable weight): a chain of cast/view nodes leads back to the parameter's accumulator. Out of
        it (a frozen weight): a tensor with a parameter's shape, or its transpose, in another dtype than the parameter.
        """
        node = t.grad_fn
        if node is None:
            shapes = [tuple(t.shape)] + ([tuple(t.mT.shape)] if t.dim() == 2 else [])
            return any(s in self.param_dtypes and t.dtype not in self.param_dtypes[s] for s in shapes)
        for _ in range(4):
            if node is None or type(node).__name__ not in _PARAM_PATH_NODES or len(node.next_functions) < 1:
                return False
            node = node.next_functions[0][0]
            variable = getattr(node, "variable", None)
            if variable is not None:
                return _storage_ptr(variable) in self.param_ptrs
        return False

    def _pack(self, t: torch.Tensor):
        if (
            t.device.type in self.host_device_types
            or t.numel() * t.element_size() < self.min_bytes
            or _storage_ptr(t) in self.param_ptrs
            or self.is_parameter_cast(t)
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

    def __enter__(self) -> ActivationOffload:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)
