"""TRAMS' query-independent memory selection (Yu et al. 2023, §2.2-2.4, §3.2; docs/attention_memory.md).

The reformulated key of pool token j for query head h is `K'_{j,h} = W_{q,h}^T k_j` (in R^D), so that
`q_{i,h} . k_j = x_i . K'_{j,h}`. Its norm and its coordinate sum rank the pool without any query. Both are computed
exactly without building `K'` (TRAMS §2.2): `1^T K' = a_h . k` with `a_h = W_{q,h} 1`, and `|K'|^2 = k^T G_h k` with
`G_h = W_{q,h} W_{q,h}^T`.
"""

from __future__ import annotations

import torch


def trams_scores(
    keys: torch.Tensor,
    w_q: torch.Tensor,
    norm_weight: torch.Tensor | None,
    num_heads: int,
    score: str = "code",
    select_per: str = "query_head",
) -> torch.Tensor:
    """The TRAMS metric of every pool token, `[B, Hq, M]` (`select_per="query_head"`) or `[B, Hkv, M]`.

    Args:
        keys: `[B, Hkv, M, Dh]` content keys of the pool (pre-RoPE; no position term, as in TRAMS' release;
            docs/attention_memory.md).
        w_q: `[Hq * Dh, D]` query projection of the layer.
        norm_weight: `[D]` weight of the norm before attention, folded in as `K'' = gamma * K'`
            (docs/attention_memory.md: the query side is then the unit-RMS input, whose norm is constant), or None to
            use `W_q` as is.
        num_heads: query heads `Hq`; query head h reads key/value head `h // (Hq / Hkv)`.
        score: `"code"` = `|K'| * |1^T K'|` (TRAMS' release, the default: its numbers are the reported ones),
            `"paper"` = `1^T K' / sqrt(D)` (signed), `"norm"` = `|K'|` (the paper's Fig. 3 baseline).
        select_per: `"kv_head"` sums each group's query-head scores into one score per key/value head.
    """
    batch, kv_heads, size, head_dim = keys.shape
    width = w_q.shape[-1]
    # float64, rounded to float32 at the end: a slot's score then does not depend on which slots it is scored with
    # (float32 matmul kernels round differently with the pool's size), and equal keys score exactly equal
    w = w_q.double().view(num_heads, head_dim, width)
    if norm_weight is not None:
        w = w * norm_weight.double()  # W_{q,h} diag(gamma): K'' = gamma * K'
    a = w.sum(-1)  # [Hq, Dh]
    gram = w @ w.transpose(1, 2)  # [Hq, Dh, Dh]
    k = keys.double().repeat_interleave(num_heads // kv_heads, dim=1)  # [B, Hq, M, Dh]
    ones_dot = torch.einsum("bhmd,hd->bhm", k, a)
    norm = ((k @ gram) * k).sum(-1).clamp_min(0).sqrt()  # k^T G_h k, one batched matmul
    if score == "code":
        out = norm * ones_dot.abs()
    elif score == "paper":
        out = ones_dot / width**0.5
    elif score == "norm":
        out = norm
    else:
        raise ValueError(f"`score` must be one of ['code', 'paper', 'norm'], got {score!r}.")
    if select_per == "kv_head":
        out = out.view(batch, kv_heads, num_heads // kv_heads, size).sum(2)
    return out.float()


def trams_select(scores: torch.Tensor, valid: torch.Tensor, recent_keep: int, select_size: int) -> torch.Tensor:
    """Pool slots attended, `[B, H, select_size]`, ascending (stream order), per row and head (TRAMS §3.2;
    docs/attention_memory.md).

    The pool is right-aligned (oldest first, empty slots in front). The newest `recent_keep` slots are always
    kept; the other `select_size - recent_keep` are the highest `scores` `[B, H, M]` among the older valid slots
    (of equal scores, the older slot).
    When fewer valid slots are eligible, empty slots fill the rest (they stay masked by `valid`). Indices carry
    no gradient.
    """
    size = scores.shape[-1]
    recent = min(recent_keep, size)
    top = min(select_size - recent, size - recent)
    older = scores[..., : size - recent].detach().masked_fill(~valid[:, None, : size - recent], float("-inf"))
    # a stable sort: of equal scores (equal keys), the older slot, whichever slots were scored
    chosen = older.sort(dim=-1, descending=True, stable=True).indices[..., :top].sort(dim=-1).values
    newest = torch.arange(size - recent, size, device=scores.device).expand(*scores.shape[:2], recent)
    return torch.cat([chosen, newest], dim=-1)
