"""HMT memory retrieval: cross-attention from a segment summary over cached memory embeddings (HMT §3.2, eq. 2-3)."""

from __future__ import annotations

import math

import torch
from torch import nn


class MemoryRetrieval(nn.Module):
    """`P = softmax((S W_q)(C W_k)^T / sqrt(d_h)) C`: a convex combination of the raw cached embeddings.

    No value or output projection, so the result stays in the distribution of the memory embeddings (HMT §3.2).
    """

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.query = nn.Linear(dim, hidden, bias=False)
        self.key = nn.Linear(dim, hidden, bias=False)
        self.scale = 1.0 / math.sqrt(hidden)

    def weights(self, summary: torch.Tensor, cache: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Attention weights `[B, N]` over the valid cache entries (fp32 softmax; all-invalid rows are uniform)."""
        q = self.query(summary.to(self.query.weight.dtype))  # [B, d_h]
        k = self.key(cache.to(self.key.weight.dtype))  # [B, N, d_h]
        scores = torch.einsum("bh,bnh->bn", q, k).float() * self.scale
        scores = scores.masked_fill(~valid.bool(), torch.finfo(torch.float32).min)
        return torch.softmax(scores, dim=-1)

    def forward(self, summary: torch.Tensor, cache: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Retrieve `[B, d]` from `cache` `[B, N, d]` with query `summary` `[B, d]`."""
        weights = self.weights(summary, cache, valid)
        return torch.einsum("bn,bnd->bd", weights.to(cache.dtype), cache)
