"""Corpus perplexity of a `MemoryModel`: exp(total NLL / total predicted tokens), never a mean of per-batch values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tqdm.auto import tqdm

from ..data import WindowCollator
from ..model import MemoryModel


@torch.no_grad()
def corpus_nll(
    model: MemoryModel, windows: Sequence[Sequence[int]], batch_size: int = 1, progress: bool = False
) -> tuple[float, int]:
    """Summed next-token NLL and the number of predicted tokens over `windows` (token-id lists, each read from an
    empty memory). Wrap the call in `model.disable_memory()` for the same-window baseline (each segment alone)."""
    if not windows:
        raise ValueError("`windows` is empty: nothing to evaluate.")
    collate = WindowCollator()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    batches = range(0, len(windows), batch_size)
    for start in tqdm(batches, desc="perplexity", disable=not progress, leave=False):
        batch = collate([{"input_ids": w} for w in windows[start : start + batch_size]])
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        out = model(**batch)
        total += float(out.loss) * int(out.num_tokens)
        count += int(out.num_tokens)
    return total, count


def perplexity(model: MemoryModel, windows: Sequence[Sequence[int]], batch_size: int = 1, progress: bool = False) -> float:
    """Corpus perplexity exp(total NLL / total predicted tokens) over `windows`."""
    total, count = corpus_nll(model, windows, batch_size, progress)
    return math.exp(total / count)
