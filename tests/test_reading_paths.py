"""The fast memory reads (filled slots only, metric only where it decides, one row lookup per gather, one mask for
all heads) give the outputs of the dense reads they replaced: those are kept here as references, verbatim, and
patched into the method."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.memory import attend
from hmt_adapters.memory.attend import MemoryRead, expand_heads, local_visibility, prefix_attention
from hmt_adapters.methods.unimem import method as unimem_method
from hmt_adapters.methods.unimem.reading import gather_rows, gather_slots, scaling_of, top_entries
from hmt_adapters.methods.unimem.trams import trams_select
from tiny import random_ids, tiny_backbone

L = 8


# ---- the dense reads (the code before the fast paths) ------------------------------------------------------------


def dense_gather(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    batch, heads, _, dim = x.shape
    if slots.dim() == 2:
        return x.gather(2, slots[:, None, :, None].expand(batch, heads, slots.shape[1], dim))
    index = slots.reshape(batch, heads, -1)[..., None].expand(-1, -1, -1, dim)
    return x.gather(2, index).view(batch, slots.shape[1], slots.shape[2], dim)


def dense_read_union(k, v, frame, call, context, window, global_tokens, topk, kept=None) -> MemoryRead:
    """Scores, masks and top-k over the whole store, empty slots included."""
    batch, _, size, _ = k.shape
    device = k.device
    slot = torch.arange(size, device=device)
    count = frame.valid.sum(1)
    first = size - count
    start = size - min(window, size)
    is_global = frame.valid & (slot[None] < (first + global_tokens)[:, None])
    distance = frame.query_positions(call)[:, :, None] - frame.pos[:, None, :]
    in_window = (frame.valid & (slot[None] >= start))[:, None, :] & (distance <= window)
    g = torch.arange(global_tokens, device=device)
    g_slots = (first[:, None] + g[None]).clamp(max=size - 1)
    g_visible = (g[None] < count[:, None])[:, None, :].expand(-1, distance.shape[1], -1)
    w_slots = slot[start:].expand(batch, -1)
    w_visible = in_window[..., start:] & ~is_global[:, None, start:]
    slots = torch.cat([g_slots, w_slots], dim=1)
    shared_pos = frame.key_positions(gather_rows(frame.pos, slots))
    k_shared = context.rotate_at(dense_gather(k, slots), shared_pos, call.query)
    read = MemoryRead(k_shared, dense_gather(v, slots), torch.cat([g_visible, w_visible], dim=-1)[:, None])
    if topk == 0:
        return read
    heads, kv_heads, q_len, dim = call.query.shape[1], k.shape[1], call.query.shape[2], k.shape[-1]
    k_all = context.rotate_at(k, frame.key_positions(frame.pos), call.query).to(call.query.dtype)
    grouped = (call.query * scaling_of(call)).reshape(batch, kv_heads, -1, dim)
    logits = (grouped @ k_all.transpose(-1, -2)).view(batch, heads, q_len, size)
    candidates = (frame.valid[:, None, :] & ~is_global[:, None, :] & ~in_window)[:, None]
    values, index = logits.masked_fill_(~candidates, float("-inf")).topk(min(topk, size), dim=-1, sorted=False)
    per_kv_head = index.reshape(batch, kv_heads, -1)[..., None].expand(-1, -1, -1, dim)
    read.pq_logits = values
    read.pq_visible = values > float("-inf")
    read.pq_v = v.gather(2, per_kv_head).view(batch, heads, q_len, -1, dim)
    return read


def dense_read_trams(k, v, metric, frame, call, context, select_size, recent_keep):
    """The metric of the whole pool, the selection among all of its slots."""
    with torch.no_grad():
        slots = trams_select(metric, frame.valid, recent_keep, select_size)
    keys = context.rotate_at(dense_gather(k, slots), frame.key_positions(gather_rows(frame.pos, slots)), call.query)
    return MemoryRead(keys, dense_gather(v, slots), gather_rows(frame.valid, slots)[:, :, None, :])


def dense_prefix_attention(query, key, value, local_visible, read, scaling, dropout=0.0):
    """The per-query-head prefix with its mask materialised for every head."""
    batch, heads, q_len, _ = query.shape
    mem_visible = expand_heads(read.visible, heads).expand(batch, heads, q_len, read.k.shape[2])
    visible = torch.cat([mem_visible, local_visible.expand(batch, heads, q_len, key.shape[2])], dim=-1)
    visible = visible | ~visible.any(-1, keepdim=True)
    keys = torch.cat([attend._all_heads(read.k, heads), attend._all_heads(key, heads)], dim=2)
    values = torch.cat([attend._all_heads(read.v, heads), attend._all_heads(value, heads)], dim=2)
    return torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=visible, scale=scaling)


# ---- fast == dense ------------------------------------------------------------------------------------------------

CASES = {
    "topk_pos0": ("llama", "memorizing_transformer", dict(memory_size=40, topk=5, memory_layers=[0, 1]), "sdpa"),
    "topk_original_gated": (
        "qwen2",
        "memorizing_transformer",
        dict(memory_size=40, topk=3, positions="original", combine="gated"),
        "sdpa",
    ),
    "topk_eager": ("llama", "memorizing_transformer", dict(memory_size=24, topk=4, memory_layers=[0, 1]), "eager"),
    "unimix": ("llama", "unimix", dict(memory_size=40, memory_tokens=2), "sdpa"),
    "union": (
        "qwen2",
        "unimix",
        dict(memory_size=40, window=5, global_tokens=3, topk=2, memory_tokens=0, memory_layers=[0, 1]),
        "sdpa",
    ),
    "window": ("llama", "transformer_xl", dict(memory_size=30, reading="window", window=11), "sdpa"),
    "global": (
        "llama",
        "transformer_xl",
        dict(memory_size=30, reading="global", global_tokens=3, positions="pos0"),
        "sdpa",
    ),
    "trams": ("llama", "trams", dict(memory_size=32, select_size=12), "sdpa"),
    "trams_kv_head": ("llama", "trams", dict(memory_size=32, select_size=12, select_per="kv_head"), "sdpa"),
    "trams_paper_original": (
        "qwen2",
        "trams",
        dict(memory_size=32, select_size=10, recent_keep=4, select_score="paper", positions="original"),
        "sdpa",
    ),
    "trams_eager": ("llama", "trams", dict(memory_size=32, select_size=12), "eager"),
    "trams_opt": ("opt", "trams", dict(memory_size=24, select_size=12), "sdpa"),
}


def outputs(model: ha.MemoryModel, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Logits of the whole document (partly filled stores in the first segments), of a left-padded batch, and the
    logits and greedy tokens of 12 tokens decoded after a prompt (the one-token paths, across two segment ends)."""
    with torch.no_grad():
        decoded = model.generate(
            input_ids=ids[:, : 3 * L + 5],
            max_new_tokens=12,
            do_sample=False,
            pad_token_id=0,
            return_dict_in_generate=True,
            output_logits=True,
        )
        return [
            model(input_ids=ids).logits,
            model(input_ids=ids, attention_mask=mask).logits,
            torch.stack(decoded.logits, 1),
            decoded.sequences,
        ]


@pytest.mark.parametrize("case", list(CASES))
def test_fast_reads_equal_the_dense_reads(case, monkeypatch):
    family, method, overrides, impl = CASES[case]
    ids = random_ids(2, 7 * L + 3)
    mask = torch.ones_like(ids)
    mask[1, :13] = 0
    base = tiny_backbone(family)
    base.set_attn_implementation(impl)
    model = ha.wrap_with_memory(base, method, segment_length=L, **overrides).eval()
    fast = outputs(model, ids, mask)
    monkeypatch.setattr(attend, "QUERY_SLICE_FLOATS", 200)  # top-k scored a few queries at a time
    chunked = outputs(model, ids, mask)
    monkeypatch.setattr(unimem_method, "read_union", dense_read_union)
    monkeypatch.setattr(unimem_method, "read_trams", dense_read_trams)
    monkeypatch.setattr(attend, "prefix_attention", dense_prefix_attention)
    monkeypatch.setattr(attend, "retrieved_attention", lambda *args: None)  # the explicit joint softmax
    dense = outputs(model, ids, mask)
    torch.testing.assert_close(fast[0], dense[0], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(fast[1], dense[1], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(fast[2], dense[2], atol=2e-6, rtol=1e-5)
    assert torch.equal(fast[3], dense[3])
    for got, want in zip(chunked[:3], fast[:3]):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert torch.equal(chunked[3], fast[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_two_pass_top_k_finds_the_entries_of_torch_topk(dtype):
    """`top_entries` (group maxima, then the best groups' entries, each `topk` on the scores' bits as integers)
    returns the values `torch.topk` returns, at indices that hold them: many rows (the two-pass path), lengths not
    divisible by the group, rows with fewer finite entries than k, ties at -inf, rows whose best entries are
    negative or zero of either sign, and few rows (one pass)."""
    gen = torch.Generator().manual_seed(3)
    for rows, n, k in [(300, 5120, 32), (300, 1283, 4), (260, 2000, 32), (4, 1280, 4)]:
        scores = torch.randn(2, rows // 2, n, generator=gen)
        scores[0, :7, : n - 10] = float("-inf")  # 10 finite entries, k of 32 asks for more
        scores[1, :3, n // 3 :] = float("-inf")
        scores[0, 7:20] -= 100.0  # every entry negative: their bits as integers order them in reverse
        scores[1, 3:6, ::2] = 0.0
        scores[1, 3:6, 1::2] = -0.0
        scores = scores.to(dtype)
        values, index = top_entries(scores, k)
        expected = scores.topk(k, dim=-1).values
        assert torch.equal(values.sort(-1, descending=True).values, expected)
        assert torch.equal(scores.gather(-1, index), values)
        finite = values > float("-inf")
        for row_index, row_finite in zip(index.reshape(-1, k), finite.reshape(-1, k)):
            assert row_index[row_finite].unique().numel() == int(row_finite.sum())  # no entry twice


def test_row_lookup_gather_equals_the_index_gather_per_row_and_per_query_head():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 9, 3, generator=gen)
    per_row = torch.randint(0, 9, (2, 5), generator=gen)
    per_head = torch.randint(0, 9, (2, 4, 6), generator=gen)  # 4 query heads over 2 key/value heads
    assert torch.equal(gather_slots(x, per_row), dense_gather(x, per_row))
    assert torch.equal(gather_slots(x, per_head), dense_gather(x, per_head))
    per_query = torch.randint(0, 6, (2, 4, 3, 2), generator=gen)  # [B, Hq, q, K], into the last 6 slots
    expected = dense_gather(x, (per_query + 3).reshape(2, 4, 6)).view(2, 4, 3, 2, 3)
    assert torch.equal(gather_slots(x, per_query + 3), expected)


@pytest.mark.parametrize("grad", [False, True])  # inference: two kernel calls merged by LSE; training: one SDPA
@pytest.mark.parametrize("padded", [False, True])
def test_prefix_attention_equals_the_mask_per_head(grad, padded):
    """`prefix_attention` (one mask for all heads where every entry is visible; at inference the memory and the
    segment as two kernel calls merged by log-sum-exp, the segment with the kernel's causal mask) against the prefix
    with its mask built for every head, including queries that see nothing (they read every key)."""
    gen = torch.Generator().manual_seed(2)
    B, Hq, Hkv, q, S, D = 2, 4, 2, 5, 7, 8
    query = torch.randn(B, Hq, q, D, generator=gen).requires_grad_(grad)
    key, value = torch.randn(B, Hkv, q, D, generator=gen), torch.randn(B, Hkv, q, D, generator=gen)
    local = local_visibility(None, q, q, query.device)
    if padded:  # row 1 left-padded by 2: its first two queries see no local key
        local = local.repeat(B, 1, 1, 1)
        local[1, ..., :2] = False
    hidden = torch.rand(B, Hq, 1, S, generator=gen) > 0.4
    hidden[1, 0] = False  # head 0 of row 1 sees no memory entry: with padding, two of its queries see nothing
    for visible in (torch.ones(B, Hq, 1, S, dtype=torch.bool), hidden):
        read = MemoryRead(torch.randn(B, Hq, S, D, generator=gen), torch.randn(B, Hq, S, D, generator=gen), visible)
        with torch.no_grad():
            want = dense_prefix_attention(query, key, value, local, read, 0.3)
        got = prefix_attention(query, key, value, local, read, 0.3)
        assert got.requires_grad == grad
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
        for dtype, tol in ((torch.bfloat16, 3e-2), (torch.float16, 5e-3)):  # the same path, to the dtype's rounding
            with torch.no_grad():
                args = [t.detach().to(dtype) for t in (query, key, value)]
                half = MemoryRead(read.k.to(dtype), read.v.to(dtype), visible)
                got = prefix_attention(*args, local, half, 0.3)
            assert got.dtype == dtype
            torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("memory_heads", [2, 4])  # shared entries per key/value head or per query head
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_retrieved_attention_by_the_kernels_log_sum_exp_equals_the_explicit_joint_softmax(memory_heads, dtype):
    """The inference path for entries retrieved per query (the kernel over shared + local, merged with the retrieved
    part by log-sum-exp) against `joint_attention`, including queries that see nothing in one part or in any."""
    gen = torch.Generator().manual_seed(7)
    B, Hq, Hkv, q, S, K, D = 2, 4, 2, 6, 5, 3, 8

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype)

    query, key, value = randn(B, Hq, q, D), randn(B, Hkv, q + 2, D), randn(B, Hkv, q + 2, D)
    local = torch.ones(q, q + 2, dtype=torch.bool).tril(2)[None, None].repeat(B, 1, 1, 1)
    local[1, ..., :3] = False  # row 1 left-padded: its first 3 keys hidden, its query 0 sees no local key
    shared = torch.rand(B, 1, q, S, generator=gen) > 0.5
    shared[1, :, 0] = False
    retrieved = torch.rand(B, Hq, q, K, generator=gen) > 0.3
    retrieved[1, :, 0] = False  # query 0 of row 1 sees nothing at all: the explicit softmax's uniform row
    retrieved[1, :, 1] = False  # query 1 sees local and (maybe) shared entries only
    retrieved[0, :, 2] = True
    local[0, :, 2] = False  # query 2 of row 0 sees retrieved and shared entries only
    read = MemoryRead(
        randn(B, memory_heads, S, D),
        randn(B, memory_heads, S, D),
        shared,
        pq_logits=torch.randn(B, Hq, q, K, generator=gen),
        pq_v=randn(B, Hq, q, K, D),
        pq_visible=retrieved,
    )
    fused = attend.retrieved_attention(query, key, value, local, read, 0.3)
    assert fused is not None and fused.dtype == dtype
    # the explicit softmax runs in float32 for every dtype
    tol = {torch.bfloat16: 2e-2, torch.float16: 5e-3}.get(dtype, 1e-6)
    tol = dict(atol=tol, rtol=tol)
    torch.testing.assert_close(fused, attend.joint_attention(query, key, value, local, read, 0.3), **tol)
    query.requires_grad_(True)  # the kernel's log-sum-exp has no gradient: training takes the explicit path
    assert attend.retrieved_attention(query, key, value, local, read, 0.3) is None


@pytest.mark.parametrize("memory_heads", [2, 4])  # key/value heads (Transformer-XL, Elastic) or query heads (TRAMS)
def test_one_decoded_token_without_concatenation_equals_the_prefix_attention(memory_heads):
    gen = torch.Generator().manual_seed(5)
    B, Hq, Hkv, n, S, D = 2, 4, 2, 6, 7, 8
    query = torch.randn(B, Hq, 1, D, generator=gen)
    key, value = torch.randn(B, Hkv, n, D, generator=gen), torch.randn(B, Hkv, n, D, generator=gen)
    local = torch.ones(B, 1, 1, n, dtype=torch.bool)
    local[1, ..., :2] = False  # a left-padded row
    visible = torch.rand(B, memory_heads, 1, S, generator=gen) > 0.3
    memory_k = torch.randn(B, memory_heads, S, D, generator=gen)
    read = MemoryRead(memory_k, torch.randn(B, memory_heads, S, D, generator=gen), visible)
    torch.testing.assert_close(
        attend.one_token_attention(query, key, value, local, read, 0.3),
        dense_prefix_attention(query, key, value, local, read, 0.3),
        atol=1e-6,
        rtol=1e-5,
    )


@pytest.mark.parametrize("memory_heads", [2, 4])  # key/value heads (Transformer-XL, Elastic) or query heads (TRAMS)
@pytest.mark.parametrize("all_visible", [True, False])
def test_decoded_tokens_over_kept_keys_equal_the_prefix_attention_at_every_step(memory_heads, all_visible):
    """`decoded_token_attention` keeps `[memory ; window]` between steps and appends only the new window entries:
    at every step it equals the prefix attention over the whole window, while the window grows past the buffer's
    room, when it stops growing (a rolling cache: copied again) and when a padding mask appears."""
    gen = torch.Generator().manual_seed(7)
    B, Hq, Hkv, S, D = 2, 4, 2, 5, 8
    visible = torch.ones(B, memory_heads, 1, S, dtype=torch.bool)
    if not all_visible:
        visible = torch.rand(B, memory_heads, 1, S, generator=gen) > 0.3
    read = MemoryRead(
        torch.randn(B, memory_heads, S, D, generator=gen), torch.randn(B, memory_heads, S, D, generator=gen), visible
    )
    reference = MemoryRead(read.k.clone(), read.v.clone(), visible)
    key, value = torch.randn(B, Hkv, 3, D, generator=gen), torch.randn(B, Hkv, 3, D, generator=gen)
    for step in range(80):  # grows past the first buffer (64 + 2 * 3 entries), then rolls (sliding window of 72)
        new_k, new_v = torch.randn(B, Hkv, 1, D, generator=gen), torch.randn(B, Hkv, 1, D, generator=gen)
        key, value = torch.cat([key, new_k], 2)[:, :, -72:], torch.cat([value, new_v], 2)[:, :, -72:]
        mask = None
        if step >= 40:  # a left-padded row from here on (the layer's own bool mask)
            mask = torch.ones(B, 1, 1, key.shape[2], dtype=torch.bool)
            mask[1, ..., :2] = False
        query = torch.randn(B, Hq, 1, D, generator=gen)
        local = local_visibility(mask, 1, key.shape[2], query.device)
        torch.testing.assert_close(
            attend.decoded_token_attention(query, key, value, mask, read, 0.3),
            dense_prefix_attention(query, key, value, local, reference, 0.3),
            atol=1e-6,
            rtol=1e-5,
        )
    assert read.decoding is not None and read.decoding.local == 72
