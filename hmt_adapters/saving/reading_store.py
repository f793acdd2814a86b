"""`ReadingStore`: the memory state of a long read, kept in a folder as it grows, so that a read killed part way
continues from its last save instead of token 0 (docs/generation.md, "A read that survives a restart").

A save writes only the state tensors that are new since the last one (states are never changed in place, so a tensor
is new when it is not the very tensor saved before): an InfLLM block, once cut, is written once however often the
read is saved, and saving every N tokens of a long document costs the new blocks, not the whole store again. Each save
writes its tensors to a part file of its own, then `reading.json` (which part holds which tensor, the tokens read,
what was read) by one rename; a kill at any moment leaves the previous save whole, and the parts no save refers to
are removed by the next one.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..state import MemoryState

MANIFEST = "reading.json"
FORMAT = 1
PENDING = ("pending_ids", "pending_mask")


class ReadingStore:
    """The folder of one read: `latest()` is the state of its last save (None for an empty folder), `save(state,
    **facts)` adds one."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = os.fspath(folder)
        if os.path.isfile(self.folder):
            raise ValueError(f"`state_dir` {self.folder!r} is a file; pass a folder (it is made if missing).")
        os.makedirs(self.folder, exist_ok=True)
        self._saved: dict[str, tuple[torch.Tensor, str]] = {}  # name -> (the tensor saved, its part file)
        self._next = 0

    def latest(self, device: torch.device | str = "cpu") -> tuple[MemoryState, dict[str, Any]] | None:
        """The state of the last complete save and the facts saved with it, or None when nothing was saved."""
        manifest = self._manifest()
        if manifest is None:
            return None
        loaded: dict[str, dict[str, torch.Tensor]] = {}
        tensors: dict[str, torch.Tensor] = {}
        for name, part in manifest["parts"].items():
            if part not in loaded:
                loaded[part] = load_file(os.path.join(self.folder, part), device=str(device))
            tensors[name] = loaded[part][name]
            self._saved[name] = (tensors[name], part)
        self._next = 1 + max((int(p.split("-")[1].split(".")[0]) for p in loaded), default=-1)
        state = MemoryState(
            manifest["method"],
            {k[len("tensors.") :]: v for k, v in tensors.items() if k.startswith("tensors.")},
            manifest["segments_seen"],
            extras=manifest["extras"],
        )
        if "pending_ids" in tensors:
            state.pending_ids, state.pending_mask = tensors["pending_ids"], tensors["pending_mask"]
        return state, manifest["facts"]

    def save(self, state: MemoryState, **facts: Any) -> None:
        """Add a save of `state` with `facts` (JSON-able: how much of what was read)."""
        current = {f"tensors.{k}": v for k, v in state.tensors.items()}
        if state.pending_ids is not None and state.pending_mask is not None:
            current.update(pending_ids=state.pending_ids, pending_mask=state.pending_mask)
        new = {k: v for k, v in current.items() if k not in self._saved or self._saved[k][0] is not v}
        part = f"part-{self._next:06d}.safetensors"
        self._next += 1
        if new:
            staging = os.path.join(self.folder, f".{part}.tmp")
            save_file({k: v.detach().contiguous().cpu() for k, v in new.items()}, staging)
            os.replace(staging, os.path.join(self.folder, part))
        saved = {k: self._saved[k] for k in current if k not in new}
        saved.update({k: (v, part) for k, v in new.items()})
        self._saved = saved
        manifest = {
            "format": FORMAT,
            "method": state.method,
            "segments_seen": state.segments_seen,
            "extras": state.extras,
            "facts": facts,
            "parts": {k: p for k, (_, p) in saved.items()},
        }
        staging = os.path.join(self.folder, f".{MANIFEST}.tmp")
        with open(staging, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh)
        os.replace(staging, os.path.join(self.folder, MANIFEST))
        self._remove_unused({p for _, p in saved.values()})

    def _manifest(self) -> dict[str, Any] | None:
        path = os.path.join(self.folder, MANIFEST)
        if not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as fh:
            manifest = json.load(fh)
        if manifest.get("format") != FORMAT:
            raise ValueError(
                f"{path} is not a reading state this version writes (format {manifest.get('format')!r}, expected "
                f"{FORMAT}); use another `state_dir` or empty this one."
            )
        return manifest

    def _remove_unused(self, used: set[str]) -> None:
        """Parts no save refers to any more, and what a killed save left half-written."""
        for name in os.listdir(self.folder):
            stale = name.startswith("part-") and name not in used
            if stale or (name.startswith(".part-") and name.endswith(".tmp")):
                os.remove(os.path.join(self.folder, name))
