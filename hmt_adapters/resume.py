"""A read that survives a restart (`MemoryModel.step(..., state_dir=...)`, `ask(..., state_dir=...)`): the document
is read in chunks of `save_every` tokens, the state saved after each into a folder (`saving.reading_store`), and a
read started again on the same document continues from the last save (docs/generation.md, "A read that survives a
restart").

What a save holds is checked before it is continued: the tokens it read (a SHA-256 of their ids and mask), the
batch size, and, by `step`, the signature of the model that made the state. A folder that holds a read of another
document starts over, with a warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any

import torch

from .runtime import progress
from .saving.reading_store import ReadingStore
from .state import MemoryState

logger = logging.getLogger(__name__)


def digest(ids: torch.Tensor, mask: torch.Tensor, tokens: int) -> str:
    """What the first `tokens` columns of a batch are: a SHA-256 of their ids and mask."""
    sha = hashlib.sha256()
    for t in (ids[:, :tokens], mask[:, :tokens]):
        sha.update(t.to(device="cpu", dtype=torch.int64).contiguous().numpy().tobytes())
    return sha.hexdigest()


def resumed(store: ReadingStore, ids: torch.Tensor, mask: torch.Tensor) -> tuple[MemoryState, int] | None:
    """The state of `store`'s last save and the tokens it read, when they are the first tokens of `ids`/`mask`."""
    found = store.latest(ids.device)
    if found is None:
        return None
    state, facts = found
    read = int(facts.get("tokens_read", -1))
    same = 0 < read <= ids.shape[1] and facts.get("batch_size") == ids.shape[0]
    if same and facts.get("digest") == digest(ids, mask, read):
        return state, read
    logger.warning(
        "%s holds a read of other tokens (%s of them, batch %s) than this input begins with: the read starts over "
        "and replaces it.",
        store.folder,
        read,
        facts.get("batch_size"),
    )
    return None


def read_resumable(
    model: Any, ids: torch.Tensor, mask: torch.Tensor, state_dir: str | os.PathLike, save_every: int | None
) -> MemoryState:
    """`model`'s state after reading `ids`/`mask` `[B, T]` from an empty memory, continued from `state_dir`'s last
    save where it holds the start of this read, and saved there after every `save_every` tokens (rounded down to
    whole segments; None: once, at the end)."""
    length = model.memory_config.segment_length
    total = ids.shape[1]
    chunk = total if save_every is None else max(length, save_every // length * length)
    store = ReadingStore(state_dir)
    found = resumed(store, ids, mask)
    state, done = found if found is not None else (model.init_memory(ids.shape[0], ids.device), 0)
    with progress.reading(model.runtime, total, length, done=done):
        for start in range(done, total, chunk):
            end = min(start + chunk, total)
            _, state = model.step(ids[:, start:end], state, attention_mask=mask[:, start:end], return_logits=False)
            store.save(state, tokens_read=end, batch_size=ids.shape[0], digest=digest(ids, mask, end))
    return state
