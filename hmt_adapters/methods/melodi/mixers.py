"""MELODI's linear token mixers: fixed learned combinations over the token axis of `[context ; summary]` slots.

A mixer `T` `[out, W + S]` maps a layer's output `Y = [x ; û]` `[B, W + S, D]` to `T @ Y` `[B, out, D]`, shared over
channels and batch, without bias, norm or activation (MLP-Mixer token mixing, MELODI §3.2; the paper names none).
"""

from __future__ import annotations

import torch


def mix(weight: torch.Tensor, hidden: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """`weight` `[out, W + S]` applied to a window's `hidden` `[B, W' + S, D]` with `W' <= W` token slots.

    Column `j < W` belongs to token slot `j`, column `W + i` to summary `i`. A shorter (final or still open) window
    uses the first `W'` token columns, which is padding it to `W` with zero-weight columns; padded slots
    (`token_mask` `[B, W']` = 0) contribute nothing. Several mixers of one layer stack along `out` into one matmul.
    """
    slots = token_mask.shape[1]
    summaries = hidden.shape[1] - slots
    window = weight.shape[1] - summaries
    if slots < window:
        weight = torch.cat([weight[:, :slots], weight[:, window:]], dim=1)
    keep = torch.cat(
        [token_mask.to(hidden.dtype), token_mask.new_ones(token_mask.shape[0], summaries, dtype=hidden.dtype)], 1
    )
    return torch.matmul(weight.to(hidden.dtype), hidden * keep[..., None])


def pass_summaries(summaries: int, window: int) -> torch.Tensor:
    """`[0 | I_S]`: the mixer passes the block's summary outputs through, so at init `u = z = û` (the "no
    branching" model of MELODI Table 4; init not in the paper: docs/melodi.md)."""
    weight = torch.zeros(summaries, window + summaries)
    weight[:, window:] = torch.eye(summaries)
    return weight


def average_pool(outputs: int, window: int, summaries: int) -> torch.Tensor:
    """Output `j` averages the context slots of the `j`-th of `outputs` near-equal groups; summary columns are 0
    (long-term mixer init; not in the paper: docs/melodi.md). Groups that would be empty (`outputs > window`) reuse the
    slot their boundary falls on."""
    weight = torch.zeros(outputs, window + summaries)
    edges = torch.linspace(0, window, outputs + 1)
    for j in range(outputs):
        lo = min(int(edges[j]), window - 1)
        hi = max(int(edges[j + 1]), lo + 1)
        weight[j, lo:hi] = 1.0 / (hi - lo)
    return weight
