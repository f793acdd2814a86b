"""Polynomial sampling: where a HiPPO state is read (Elastic Memory Sec. 2.3, App. E.4).

A state that holds `t` tokens is a polynomial over `[0, t]`; `L_mem` points `x_j` in that interval become the
memory tokens. The paper leaves `L_mem` and the exponential `alpha` open; the defaults here are ours
(docs/elastic_memory.md).
"""

from __future__ import annotations

import torch

STRATEGIES = ("uniform", "exponential")


def exponential_alpha(t: int, count: int, order: int) -> float:
    """The per-block `alpha` that puts the newest sample one resolution cell (`max(1, t/N)` tokens) before the
    present: `t * alpha^(count-1) = max(1, t/N)` (not in the paper, docs/elastic_memory.md; a fixed `alpha` piles
    samples next to `t`)."""
    return (max(1.0, t / order) / t) ** (1.0 / (count - 1))


def sample_points(strategy: str, t: int, count: int, order: int, alpha: float | None = None) -> torch.Tensor:
    """`count` points (float64) in `[0, t]` at which a state of order `order` holding `t >= 1` tokens is read.

    - `"uniform"`: `x_j = j t / count`, `j = 0..count-1` (Elastic_uni; includes 0, excludes t).
    - `"exponential"`: `x_j = t (1 - alpha^(count-1-j))` (Elastic_exp): `x = 0` is the oldest sample and the spacing
      shrinks geometrically toward the present. `alpha=None` uses `exponential_alpha`.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"`sampling` must be one of {list(STRATEGIES)}, got {strategy!r}.")
    j = torch.arange(count, dtype=torch.float64)
    if strategy == "uniform":
        return j * t / count
    if count == 1:
        return torch.zeros(1, dtype=torch.float64)
    if alpha is None:
        alpha = exponential_alpha(t, count, order)
    return t * (1 - alpha ** (count - 1 - j))
