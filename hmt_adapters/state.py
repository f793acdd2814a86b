"""`MemoryState`: the explicit memory carried between calls, its row operations (select, merge), the check that a
model can continue it (`check_state`) and its file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from .saving.files import ADAPTER_FILE_KIND, STATE_FILE_KIND

STATE_SIGNATURE = "made_for"  # key in `MemoryState.extras`: the config and backbone sizes of the model that made it
FILE_KIND = STATE_FILE_KIND  # safetensors metadata `hmt_adapters_file` of a saved state


@dataclass
class MemoryState:
    """What a memory method carries from one segment to the next, for `batch_size` independent streams.

    `tensors` is a flat name -> tensor mapping (batch first) owned by the method; `pending_ids`/`pending_mask`
    hold the tokens of a segment that a streaming `step()` has started but not yet closed. `extras` holds small
    JSON-able facts carried with the state; `extras["made_for"]` is the signature (method config and backbone sizes)
    of the model that made it, so that another model refuses the state naming the difference.
    """

    method: str
    tensors: dict[str, torch.Tensor]
    segments_seen: int = 0
    pending_ids: torch.Tensor | None = None  # [B, r], 0 <= r < segment_length
    pending_mask: torch.Tensor | None = None  # [B, r] 1 = pending token; rows with fewer are right-padded
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        for t in self.tensors.values():
            return t.shape[0]
        return 0 if self.pending_ids is None else self.pending_ids.shape[0]

    @property
    def pending_length(self) -> int:
        return 0 if self.pending_ids is None else self.pending_ids.shape[1]

    def _map(self, fn) -> MemoryState:
        return MemoryState(
            self.method,
            {k: fn(v) for k, v in self.tensors.items()},
            self.segments_seen,
            None if self.pending_ids is None else fn(self.pending_ids),
            None if self.pending_mask is None else fn(self.pending_mask),
            dict(self.extras),
        )

    def detach(self) -> MemoryState:
        """A copy whose tensors carry no autograd history (gradients stop here)."""
        return self._map(lambda t: t.detach())

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> MemoryState:
        """A copy on `device`; floating tensors are cast to `dtype` when given."""
        return self._map(
            lambda t: t.to(device=device, dtype=dtype if dtype is not None and t.is_floating_point() else None)
        )

    def clone(self) -> MemoryState:
        return self._map(lambda t: t.clone())

    # ---- serialisation ---------------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to one safetensors file (tensors plus JSON metadata)."""
        tensors = {f"tensors.{k}": v.detach().contiguous() for k, v in self.tensors.items()}
        if self.pending_ids is not None and self.pending_mask is not None:
            tensors["pending_ids"] = self.pending_ids.contiguous()
            tensors["pending_mask"] = self.pending_mask.contiguous()
        meta = {
            "hmt_adapters_file": FILE_KIND,
            "method": self.method,
            "segments_seen": str(self.segments_seen),
            "extras": json.dumps(self.extras),
        }
        save_file({k: v.cpu() for k, v in tensors.items()}, os.fspath(path), metadata=meta)

    @classmethod
    def load(cls, path: str | os.PathLike, device: torch.device | str = "cpu") -> MemoryState:
        """Read a state written by `save`; any other file is refused with what it is."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No memory state file at {path!r}.")
        try:
            with safe_open(path, framework="pt") as fh:
                meta, keys = fh.metadata() or {}, list(fh.keys())
        except (SafetensorError, OSError) as err:
            raise ValueError(
                f"{path} is not a safetensors file ({err}); MemoryState.load reads files written by MemoryState.save."
            ) from err
        if meta.get("hmt_adapters_file", FILE_KIND) != FILE_KIND or "segments_seen" not in meta:
            raise ValueError(f"{path} is {_describe(meta, keys)}, not a memory state written by MemoryState.save.")
        raw = load_file(path, device=str(device))
        tensors = {k[len("tensors.") :]: v for k, v in raw.items() if k.startswith("tensors.")}
        check_finite(tensors, f"The memory state {path}")
        return cls(
            meta["method"],
            tensors,
            int(meta["segments_seen"]),
            raw.get("pending_ids"),
            raw.get("pending_mask"),
            json.loads(meta.get("extras", "{}")),
        )


def check_finite(tensors: dict[str, torch.Tensor], source: str) -> None:
    """Refuse NaN or infinite values in loaded floating-point tensors, naming the first tensor that holds one."""
    for name, tensor in tensors.items():
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ValueError(
                f"{source}: tensor {name!r} holds {bad} NaN or infinite value(s) of {tensor.numel()}; the file is "
                "corrupted or was saved from a diverged run, and would give NaN outputs."
            )


def _describe(meta: dict[str, str], keys: list[str]) -> str:
    """What a safetensors file that is not a memory state holds, in words."""
    if meta.get("hmt_adapters_file") == ADAPTER_FILE_KIND or ("method" in meta and "segments_seen" not in meta):
        return f"the weights of a '{meta.get('method')}' memory adapter (load it with MemoryModel.from_pretrained)"
    if any("lora_" in k for k in keys):
        return "peft LoRA adapter weights"
    sample = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
    return f"a safetensors file of {len(keys)} tensor(s) ({sample or 'none'}) without memory-state metadata"


def _every_row(index: torch.Tensor, batch_size: int) -> bool:
    """Whether `index` is `0, 1, ..., batch_size - 1`: every row, in order."""
    return index.numel() == batch_size and index.tolist() == list(range(batch_size))


def select_rows(state: MemoryState, index: torch.Tensor) -> MemoryState:
    """The state of rows `index` (state tensors are batch-first); pending tokens follow their rows.

    Every row in order gives the same tensors, not copies: methods never write into a state's tensors (each update
    returns new ones), and a store can be most of the machine's memory (InfLLM's blocks of a 128k prompt are 6 GB
    on SmolLM2-135M, all copied by each `generate` from that state before this)."""
    if _every_row(index, state.batch_size):
        tensors = dict(state.tensors)
    else:
        tensors = {k: v[index] for k, v in state.tensors.items()}
    out = MemoryState(state.method, tensors, state.segments_seen, extras=dict(state.extras))
    if state.pending_ids is not None and state.pending_mask is not None:
        out.pending_ids, out.pending_mask = state.pending_ids[index], state.pending_mask[index]
    return out


def merge_rows(parts: list[tuple[torch.Tensor, MemoryState]], batch_size: int) -> dict[str, torch.Tensor]:
    """State tensors of a whole batch from `(rows, state)` parts that cover every row once (one part holding every
    row in order: its tensors, not copies; see `select_rows`)."""
    first = parts[0][1].tensors
    if len(parts) == 1 and _every_row(parts[0][0], batch_size):
        return dict(first)
    merged = {}
    for name, value in first.items():
        out = value.new_empty((batch_size, *value.shape[1:]))
        for rows, state in parts:
            out[rows] = state.tensors[name]
        merged[name] = out
    return merged


def check_state(
    state: Any,
    method: str,
    signature: dict[str, Any],
    tensor_differences: Callable[[dict[str, torch.Tensor]], list[str]],
    batch_size: int,
) -> None:
    """Refuse a `state` that a model of `method` with `signature` (its config and backbone facts) cannot continue
    with a chunk of `batch_size` rows, naming the difference. A state without a signature (`extras["made_for"]`
    removed, or built by hand) is checked by its tensors instead: `tensor_differences(state.tensors)` lists how
    their names, per-stream shapes and kinds differ from the model's states (`MemoryMethod.state_differences`), so a
    state of another method or config is refused here instead of crashing or being read wrongly (docs/adapters.md).
    """
    if not isinstance(state, MemoryState):
        raise TypeError(f"`state` must be a MemoryState from `init_memory`/`step`, got {type(state).__name__}.")
    if state.method != method:
        raise ValueError(f"This state belongs to method '{state.method}', but the model runs '{method}'.")
    made_for = state.extras.get(STATE_SIGNATURE)
    if made_for is not None:
        diffs = [
            f"{k} {made_for.get(k)!r} (state) vs {signature.get(k)!r} (model)"
            for k in sorted(set(signature) | set(made_for))
            if made_for.get(k) != signature.get(k)
        ]
        if diffs:
            raise ValueError(f"This state was made by another '{method}' model: {'; '.join(diffs)}.")
    else:
        diffs = tensor_differences(state.tensors)
        if diffs:
            raise ValueError(
                f"This state carries no signature of the model that made it (`extras[{STATE_SIGNATURE!r}]`), so it is "
                f"checked by its tensors, which are not those of this '{method}' model: {'; '.join(diffs)}. "
                "A state fits only a model of the same method, config and backbone: make it with this model's "
                "`init_memory`/`step`."
            )
    if state.batch_size != batch_size:
        raise ValueError(f"The state holds {state.batch_size} streams but the chunk has batch size {batch_size}.")
