"""Corpus perplexity of a `MemoryModel`: exp(total NLL / total predicted tokens), never a mean of per-batch values."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
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


def perplexity(
    model: MemoryModel, windows: Sequence[Sequence[int]], batch_size: int = 1, progress: bool = False
) -> float:
    """Corpus perplexity exp(total NLL / total predicted tokens) over `windows`."""
    total, count = corpus_nll(model, windows, batch_size, progress)
    return math.exp(total / count)


@torch.no_grad()
def token_nll(model: MemoryModel, ids: torch.Tensor) -> torch.Tensor:
    """NLL of every next-token prediction of one document `ids` `[T]` read from an empty memory, `[T - 1]`.

    The document is streamed one segment at a time (`step`), so memory use does not grow with its length.
    """
    length = model.memory_config.segment_length
    device = next(model.parameters()).device
    state, previous, losses = None, None, []
    for start in range(0, ids.numel(), length):
        chunk = ids[start : start + length].to(device)[None]
        out, state = model.step(chunk, state)
        assert out.logits is not None
        logits = out.logits[0].float()
        if previous is not None:
            losses.append(F.cross_entropy(previous[None], chunk[0, :1]))
        losses.append(F.cross_entropy(logits[:-1], chunk[0, 1:], reduction="none"))
        previous = logits[-1]
    return torch.cat([loss.reshape(-1) for loss in losses]).cpu()


@torch.no_grad()
def sliding_window_nll(
    causal_lm: torch.nn.Module, ids: torch.Tensor, window: int, stride: int, sink_tokens: int = 0
) -> torch.Tensor:
    """NLL `[T - 1]` of a plain causal LM that sees at most `window` tokens: windows end every `stride` tokens and
    score only their last `stride` targets, so every token has at least `window - stride` tokens of context.

    With `sink_tokens`, every window starts with the document's first `sink_tokens` tokens, then its last
    `window - sink_tokens` (StreamingLLM's attention sinks, Xiao et al. 2023, with the text re-read at every window
    and numbered from 0 in it): the sliding window a streaming reader with sinks is compared with (docs/infllm.md)."""
    if not 1 <= stride <= window:
        raise ValueError(f"`stride` must be in [1, `window`={window}], got {stride}.")
    if not 0 <= sink_tokens <= window - stride:
        raise ValueError(
            f"`sink_tokens` must be in [0, `window` - `stride`={window - stride}] (each window keeps its last "
            f"`stride` targets after the sinks), got {sink_tokens}."
        )
    device = next(causal_lm.parameters()).device
    losses, scored = [], 1  # targets before `scored` are done; token 0 is never a target
    while scored < ids.numel():
        end = min((scored // stride + 1) * stride, ids.numel())  # windows end at multiples of `stride`
        start = max(0, end - window)
        if sink_tokens and start > 0:  # the sinks, then the window's last tokens (no token twice)
            start = max(sink_tokens, end - (window - sink_tokens))
            chunk = torch.cat([ids[:sink_tokens], ids[start:end]]).to(device)[None]
            start -= sink_tokens  # as if the chunk were `ids[start:end]`: the targets' indices below
        else:
            chunk = ids[start:end].to(device)[None]
        logits = causal_lm(input_ids=chunk).logits[0].float()
        first = scored - start  # first target this window scores, as an index into the chunk
        losses.append(F.cross_entropy(logits[first - 1 : -1], chunk[0, first:], reduction="none"))
        scored = end
    return torch.cat(losses).cpu()


def perplexity_by_length(nll: torch.Tensor, lengths: Sequence[int]) -> dict[str, dict[str, float]]:
    """From per-token NLL `[T - 1]`: for each length C <= T, perplexity over the targets in (C/2, C] (`bin`: how well
    text that far into a document is predicted) and over all targets up to C (`prefix`)."""
    out = {}
    for c in lengths:
        if nll.numel() >= c - 1:
            out[str(c)] = {
                "bin": math.exp(float(nll[c // 2 - 1 : c - 1].mean())),
                "prefix": math.exp(float(nll[: c - 1].mean())),
            }
    return out


def perplexity_ratio(
    nll: Sequence[float], reference: Sequence[float], samples: int = 4000, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """Perplexity of one reader over another's on the same text, `(ratio, low, high)`, from paired mean NLLs of
    equal-sized stretches of it (`nll[j]`, `reference[j]`: the same targets), with a `level` bootstrap interval that
    resamples the stretches (a block bootstrap: neighbouring tokens' NLLs are not independent, stretches of a few
    hundred tokens nearly are). The ratio is exp(mean(nll) - mean(reference)); below 1 the first reader is better.
    """
    if len(nll) != len(reference) or not nll:
        raise ValueError(
            f"Need the same number (> 0) of stretches for both readers, got {len(nll)} and {len(reference)}."
        )
    if not 0 < level < 1:
        raise ValueError(f"`level` must be in (0, 1), got {level}.")
    diff = torch.tensor(nll, dtype=torch.float64) - torch.tensor(reference, dtype=torch.float64)
    picks = torch.randint(len(diff), (samples, len(diff)), generator=torch.Generator().manual_seed(seed))
    means = diff[picks].mean(1)
    tail = (1 - level) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return math.exp(float(diff.mean())), math.exp(low), math.exp(high)
