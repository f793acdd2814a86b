"""UniMem presets (Transformer-XL, Memorizing Transformer, TRAMS, UniMix): reductions to each other, the TRAMS metric
and selection by hand, the window, the gate, bounded memory, and that memory really reaches the attention."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.memory.attend import MemoryRead, joint_attention
from hmt_adapters.memory.kv import init_kv_state, push_kv
from hmt_adapters.methods.unimem import method as unimem_method
from hmt_adapters.methods.unimem import reading
from hmt_adapters.methods.unimem.trams import trams_scores, trams_select
from tiny import random_ids, tiny_backbone

L = 8


def logits(model: ha.MemoryModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def spy_reads(monkeypatch) -> list[tuple[int, MemoryRead]]:
    """Record every `(layer, MemoryRead)` the UniMem method hands to the attention."""
    seen = []
    original = unimem_method.attend_memory

    def spy(call, read, gate=None):
        seen.append((call.layer, read))
        return original(call, read, gate)

    monkeypatch.setattr(unimem_method, "attend_memory", spy)
    return seen


# ---- reductions ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "family,select_per,impl",
    [
        ("llama", "query_head", "sdpa"),
        ("qwen2", "query_head", "eager"),
        ("llama", "kv_head", "eager"),
        ("opt", "query_head", "sdpa"),
    ],
)
def test_trams_selecting_the_whole_pool_equals_transformer_xl(family, select_per, impl):
    ids = random_ids(2, 5 * L + 3)
    xl_base, trams_base = tiny_backbone(family), tiny_backbone(family)
    xl_base.set_attn_implementation(impl)
    trams_base.set_attn_implementation(impl)
    xl = ha.wrap_with_memory(xl_base, "transformer_xl", segment_length=L, memory_size=16).eval()
    trams = ha.wrap_with_memory(
        trams_base, "trams", segment_length=L, memory_size=16, select_size=16, select_per=select_per
    )
    torch.testing.assert_close(logits(trams.eval(), ids), logits(xl, ids), atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("positions", ["pos0", "original"])
def test_topk_covering_the_memory_equals_dense_attention_over_it(positions):
    """UniMem check 4: TopK(k >= memory) reads every entry once, in one joint softmax with the local keys."""
    ids = random_ids(2, 4 * L + 5)
    common = dict(segment_length=L, memory_size=20, memory_layers=[0, 1], positions=positions)
    dense = ha.wrap_with_memory(tiny_backbone("llama"), "transformer_xl", **common).eval()
    topk = ha.wrap_with_memory(tiny_backbone("llama"), "memorizing_transformer", topk=20, **common).eval()
    torch.testing.assert_close(logits(topk, ids), logits(dense, ids), atol=2e-5, rtol=1e-4)


def test_union_reads_every_entry_exactly_once():
    """Window + global + top-k over the rest covering the memory == dense attention: no entry is counted twice."""
    ids = random_ids(2, 4 * L + 5)
    common = dict(segment_length=L, memory_size=20, memory_layers=[0, 1], positions="pos0")
    dense = ha.wrap_with_memory(tiny_backbone("qwen2"), "transformer_xl", **common).eval()
    union = ha.wrap_with_memory(
        tiny_backbone("qwen2"), "unimix", window=5, global_tokens=3, topk=20, memory_tokens=0, **common
    ).eval()
    torch.testing.assert_close(logits(union, ids), logits(dense, ids), atol=2e-5, rtol=1e-4)


# ---- TRAMS metric and selection --------------------------------------------------------------------------------

# One head, D = Dh = 2, W_q = I, so K' = k. Slot 4 is the newest (always kept with recent_keep=1); 2 of slots 0..3.
HAND_KEYS = torch.tensor([[3.0, -3.0], [1.0, 1.0], [-4.0, -2.0], [2.0, 0.0], [0.5, 0.5]])


@pytest.mark.parametrize(
    "score,expected_scores,expected_slots",
    [
        # |K'| * |1.K'|: slot 2 (norm sqrt(20), sum -6) ranks first
        ("code", [0.0, 2 * 2**0.5, 20**0.5 * 6, 4.0, 0.5**0.5], [2, 3, 4]),
        # 1.K' / sqrt(D): the same slot 2 ranks last
        ("paper", [0.0, 2**0.5, -6 / 2**0.5, 2 / 2**0.5, 1 / 2**0.5], [1, 3, 4]),
        ("norm", [18**0.5, 2**0.5, 20**0.5, 2.0, 0.5**0.5], [0, 2, 4]),
    ],
)
def test_trams_selects_exactly_the_top_of_the_metric_hand_computed(score, expected_scores, expected_slots):
    keys = HAND_KEYS[None, None]  # [B=1, H=1, M=5, Dh=2]
    scores = trams_scores(keys, torch.eye(2), None, num_heads=1, score=score)
    torch.testing.assert_close(scores[0, 0], torch.tensor(expected_scores), atol=1e-5, rtol=1e-5)
    valid = torch.ones(1, 5, dtype=torch.bool)
    assert trams_select(scores, valid, recent_keep=1, select_size=3)[0, 0].tolist() == expected_slots


def test_trams_folds_the_norm_weight_and_skips_empty_slots():
    keys = HAND_KEYS[None, None]
    gamma = torch.tensor([2.0, 1.0])  # K'' = gamma * K': slot 0 -> (6, -3), slot 3 -> (4, 0)
    scores = trams_scores(keys, torch.eye(2), gamma, num_heads=1, score="paper")
    torch.testing.assert_close(scores[0, 0], torch.tensor([3.0, 3.0, -10.0, 4.0, 1.5]) / 2**0.5)
    valid = torch.tensor([[False, False, True, True, True]])  # a right-aligned pool holding 3 tokens
    assert trams_select(scores, valid, recent_keep=1, select_size=3)[0, 0].tolist() == [2, 3, 4]
    code = trams_scores(keys, torch.eye(2), gamma, num_heads=1, score="code")  # 45**.5*3, 5**.5*3, 68**.5*10, 16
    assert trams_select(code, torch.ones(1, 5, dtype=torch.bool), 1, 3)[0, 0].tolist() == [0, 2, 4]


@pytest.mark.parametrize("score", ["code", "paper", "norm"])
@pytest.mark.parametrize("select_per", ["query_head", "kv_head"])
def test_fast_metric_equals_the_naive_reformulated_key_metric(score, select_per):
    """Spec T2: the a_h / G_h form equals the metric on explicitly built K'' = gamma * W_q,h^T k (GQA, gamma)."""
    gen = torch.Generator().manual_seed(3)
    B, Hq, Hkv, M, Dh, D = 2, 4, 2, 7, 3, 10
    keys = torch.randn(B, Hkv, M, Dh, generator=gen)
    w_q = torch.randn(Hq * Dh, D, generator=gen)
    gamma = torch.rand(D, generator=gen) + 0.5
    k = keys.repeat_interleave(Hq // Hkv, dim=1)
    k_prime = torch.einsum("bhmd,hdx->bhmx", k, w_q.view(Hq, Dh, D)) * gamma  # [B, Hq, M, D]
    naive = {
        "code": k_prime.norm(dim=-1) * k_prime.sum(-1).abs(),
        "paper": k_prime.sum(-1) / D**0.5,
        "norm": k_prime.norm(dim=-1),
    }[score]
    if select_per == "kv_head":
        naive = naive.view(B, Hkv, Hq // Hkv, M).sum(2)
    fast = trams_scores(keys, w_q, gamma, Hq, score, select_per)
    torch.testing.assert_close(fast, naive, atol=1e-4, rtol=1e-5)


def test_trams_in_the_model_attends_to_the_selection_of_its_pool(monkeypatch):
    """T5/T6/T8: per layer, head and row; sorted; recent kept; the best of the rest; independent of the queries."""
    chosen = []
    original = reading.trams_select
    monkeypatch.setattr(reading, "trams_select", lambda *a: chosen.append(original(*a)) or chosen[-1])
    reads = spy_reads(monkeypatch)
    model = ha.wrap_with_memory(
        tiny_backbone("llama"), "trams", segment_length=L, memory_size=16, select_size=8
    ).eval()
    ids = random_ids(2, 3 * L)
    with torch.no_grad():
        _, state = model.step(ids[:, : 2 * L])
        chosen.clear(), reads.clear()
        model.step(ids[:, 2 * L :], state)
        first = [c.clone() for c in chosen]
        chosen.clear()
        model.step(random_ids(2, L, seed=9), state)  # other queries, same pool
    assert all(torch.equal(a, b) for a, b in zip(first, chosen)) and len(first) == 2
    w_q, _, gamma = model.adapter.layer_query(0)
    scores = trams_scores(state.tensors["k.0"], w_q, gamma, 4)  # [B, Hq=4, M=16]
    slots = first[0]
    assert slots.shape == (2, 4, 8)  # recent_keep 6 + top 2, per row and query head
    assert torch.equal(slots[..., 2:], torch.arange(10, 16).expand(2, 4, 6))
    assert bool((slots[..., 1:] > slots[..., :-1]).all())
    picked = scores[..., :10].gather(-1, slots[..., :2])
    rest = scores[..., :10].scatter(-1, slots[..., :2], float("-inf"))
    assert bool((picked.min(-1).values >= rest.max(-1).values).all())
    assert len({tuple(s.flatten().tolist()) for s in slots.unbind(1)}) > 1  # heads select differently
    assert all(read.k.shape[2] == 8 for _, read in reads)  # attention over m + n keys, not M + n


@pytest.mark.parametrize("score, select_per", [("code", "query_head"), ("paper", "kv_head")])
def test_trams_metric_kept_from_the_write_equals_the_metric_of_the_stored_keys(score, select_per):
    """Each pool slot's metric is computed once, when its key is written (`UniMem.trams_metric`), and moves with it
    through the FIFO (sliced for unpadded segments, sorted for padded ones): it equals the metric of the stored keys
    recomputed with the layer's query weights, for every layer and slot, empty ones included."""
    model = ha.wrap_with_memory(
        tiny_backbone("qwen2"),
        "trams",
        segment_length=L,
        memory_size=40,
        select_size=8,
        select_score=score,
        select_per=select_per,
    ).eval()
    ids = random_ids(2, 4 * L + 3)
    mask = torch.ones_like(ids)
    mask[1, :11] = 0  # row 1 left-padded into its second segment
    heads = model.adapter.num_heads
    with torch.no_grad():
        state = model.step(ids, attention_mask=mask)[1]
    assert state is not None
    for i in model.memory.layers:
        w_q, _, gamma = model.adapter.layer_query(i)
        want = trams_scores(state.tensors[f"k.{i}"], w_q, gamma, heads, score, select_per)
        assert torch.equal(state.tensors[f"score.{i}"], want)
    assert state.tensors["valid"].sum(1).tolist() == [32, 24]  # closed segments; both stores have empty slots


def test_trams_pool_is_updated_fifo_whatever_was_selected():
    """Spec T9: layer 0's pool (its keys depend on no earlier layer) equals Transformer-XL's."""
    ids = random_ids(2, 5 * L)
    xl = ha.wrap_with_memory(tiny_backbone("llama"), "transformer_xl", segment_length=L, memory_size=16).eval()
    trams = ha.wrap_with_memory(
        tiny_backbone("llama"), "trams", segment_length=L, memory_size=16, select_size=4
    ).eval()
    with torch.no_grad():
        _, a = xl.step(ids)
        _, b = trams.step(ids)
    for name in ("k.0", "v.0", "pos", "valid", "seen"):
        torch.testing.assert_close(b.tensors[name], a.tensors[name], atol=1e-6, rtol=1e-5)
    assert not torch.allclose(b.tensors["k.1"], a.tensors["k.1"])  # layer 1 saw a different memory


@pytest.mark.parametrize("capacity, length", [(6, 4), (6, 6), (4, 7)])
def test_the_store_keeps_each_rows_newest_real_tokens_right_aligned_with_their_positions(capacity, length):
    """`push_kv` against a per-row list: real tokens only, oldest -> newest, the newest `capacity` right-aligned
    behind empty slots, each with its stream position; segments with left, right and no padding (the unpadded ones
    take the sliced path, the padded ones the sorted one)."""
    gen = torch.Generator().manual_seed(0)
    masks = [[1] * length, [0] * 2 + [1] * (length - 2), [1] * (length - 1) + [0], [0] * length, [1] * length]
    state = init_kv_state(2, {0: (1, 3)}, capacity, "cpu", torch.float32)
    kept: list[list[tuple[int, torch.Tensor]]] = [[], []]
    seen = [0, 0]
    for n, mask in enumerate(masks):
        rows = torch.tensor([mask, masks[(n + 1) % len(masks)]])
        k = torch.randn(2, 1, length, 3, generator=gen)
        state = push_kv(state, {0: (k, -k)}, rows)
        for b in range(2):
            for t in range(length):
                if rows[b, t]:
                    kept[b].append((seen[b], k[b, 0, t]))
                    seen[b] += 1
            kept[b] = kept[b][-capacity:]
    for b in range(2):
        held = len(kept[b])
        assert state["valid"][b].tolist() == [False] * (capacity - held) + [True] * held
        assert state["pos"][b, capacity - held :].tolist() == [p for p, _ in kept[b]]
        entries = torch.stack([e for _, e in kept[b]])
        assert torch.equal(state["k.0"][b, 0, capacity - held :], entries)
        assert torch.equal(state["v.0"][b, 0, capacity - held :], -entries)
        assert int(state["seen"][b]) == seen[b]


# ---- reading and combining -------------------------------------------------------------------------------------


def test_window_reading_shows_query_i_the_entries_within_distance_w(monkeypatch):
    """UniMem check 6: query i sees clip(w - i, 0, held) entries, the newest ones."""
    reads = spy_reads(monkeypatch)
    model = ha.wrap_with_memory(
        tiny_backbone("llama"), "transformer_xl", segment_length=L, memory_size=6, reading="window", window=5
    ).eval()
    with torch.no_grad():
        model(input_ids=random_ids(1, 3 * L))
    visible = reads[-1][1].visible[0, 0]  # last segment, last layer: [queries, window slots]
    assert visible.shape == (8, 5)  # only the newest 5 of the 6 held can be within distance 5
    assert visible.sum(-1).tolist() == [5, 4, 3, 2, 1, 0, 0, 0]
    assert visible[4].tolist() == [False, False, False, False, True]


def test_joint_softmax_equals_the_gate_set_to_the_partition_ratio():
    """UniMem check 3 (eq. 12-13): g * Attn_mem + (1 - g) * Attn_local with g = Z_mem / (Z_mem + Z_local)."""
    gen = torch.Generator().manual_seed(1)
    B, Hq, Hkv, q, S, D, K = 2, 4, 2, 5, 6, 8, 3
    query = torch.randn(B, Hq, q, D, generator=gen)
    key, value = torch.randn(B, Hkv, q, D, generator=gen), torch.randn(B, Hkv, q, D, generator=gen)
    local = torch.ones(q, q, dtype=torch.bool).tril()[None, None]
    read = MemoryRead(
        torch.randn(B, Hkv, S, D, generator=gen),
        torch.randn(B, Hkv, S, D, generator=gen),
        torch.rand(B, 1, q, S, generator=gen) > 0.3,
        pq_logits=torch.randn(B, Hq, q, K, generator=gen),
        pq_v=torch.randn(B, Hq, q, K, D, generator=gen),
        pq_visible=torch.ones(B, Hq, q, K, dtype=torch.bool),
    )
    scale = D**-0.5
    joint = joint_attention(query, key, value, local, read, scale)
    k_mem = read.k.repeat_interleave(2, dim=1)
    z_mem = (query @ k_mem.transpose(-1, -2) * scale).exp().mul(read.visible).sum(-1) + read.pq_logits.exp().sum(-1)
    z_loc = (query @ key.repeat_interleave(2, dim=1).transpose(-1, -2) * scale).exp().mul(local).sum(-1)
    gate = (z_mem / (z_mem + z_loc))[..., None]
    torch.testing.assert_close(
        joint_attention(query, key, value, local, read, scale, gate=gate), joint, atol=1e-5, rtol=1e-4
    )
    memory_only = joint_attention(query, key, value, local, read, scale, gate=torch.ones(()))
    no_local = torch.zeros_like(local)  # the joint softmax without local keys is attention over memory only
    torch.testing.assert_close(
        memory_only, joint_attention(query, key, value, no_local, read, scale), atol=1e-5, rtol=1e-4
    )


def test_a_closed_gate_is_the_backbone_without_memory_and_the_gate_is_learned():
    ids = random_ids(2, 3 * L)
    model = ha.wrap_with_memory(
        tiny_backbone("llama"), "memorizing_transformer", segment_length=L, combine="gated"
    ).eval()
    assert model.memory.gate.shape == (1, 4)  # one memory layer (the last of 2), one theta per query head
    with torch.no_grad():
        model.memory.gate.fill_(-1e4)
        closed = logits(model, ids)
        with model.disable_memory():
            bare = logits(model, ids)
        model.memory.gate.fill_(0.0)
        half = logits(model, ids)
    torch.testing.assert_close(closed, bare, atol=1e-5, rtol=1e-4)
    assert (half[:, L:] - bare[:, L:]).abs().max() > 1e-4
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert model.memory.gate.grad.abs().sum() > 0


# ---- memory reaches the attention, stays bounded ---------------------------------------------------------------


@pytest.mark.parametrize(
    "method,family,extra",
    [("trams", "llama", {}), ("memorizing_transformer", "qwen2", {}), ("unimix", "gpt2", {"memory_tokens": 2})],
)
def test_memory_reaches_every_memory_layer_of_every_segment(method, family, extra, monkeypatch):
    reads = spy_reads(monkeypatch)
    model = ha.wrap_with_memory(
        tiny_backbone(family), method, segment_length=L, memory_size=16, memory_layers=[0, 1], **extra
    ).eval()
    with torch.no_grad():
        with_memory = model(input_ids=random_ids(1, 4 * L)).logits
        with model.disable_memory():
            without = model(input_ids=random_ids(1, 4 * L)).logits
    assert [layer for layer, _ in reads] == [0, 1] * 4  # one read per memory layer and segment, none when disabled
    held = [min(16, L * (n // 2)) for n in range(8)]
    for (_, read), expect in zip(reads, held):
        entries = read.visible.any(-2).sum(-1).max() + (
            0 if read.pq_visible is None else read.pq_visible.any(-2).sum(-1).max()
        )
        assert (int(entries) > 0) == (expect > 0)
    assert (with_memory[:, L:] - without[:, L:]).abs().max() > 1e-5


@pytest.mark.parametrize("method,extra", [("trams", {}), ("unimix", {"memory_tokens": 2})])
def test_memory_stays_at_memory_size_over_a_thousand_segments(method, extra):
    model = ha.wrap_with_memory(tiny_backbone("llama"), method, segment_length=L, memory_size=20, **extra).eval()
    state = model.init_memory(1)
    shapes = set()
    with torch.no_grad():
        for chunk in range(100):
            _, state = model.step(random_ids(1, 10 * L, seed=chunk), state)
            shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(state.tensors.items())))
    assert state.segments_seen == 1000 and len(shapes) == 1
    assert int(state.tensors["valid"].sum()) == 20 and int(state.tensors["seen"]) == 8000
    assert state.tensors["pos"][0].tolist() == list(range(7980, 8000))  # memory tokens never enter the K/V store
    assert state.tensors.get("memory", torch.zeros(1, 2, 32)).shape == (1, 2, 32)


# ---- presets, config, errors -----------------------------------------------------------------------------------


def test_presets_resolve_the_papers_sizes_and_layers():
    """UniMem check 10 at L = 2048 on a 22-layer TinyLlama: 2,048 / 20,480 / 20,480 + 40 entries; layers 11,21 and
    11..21 (0-based); TRAMS keeps the code's 3:1 split of the attended memory."""
    s = {
        p: ha.UniMemConfig(preset=p, segment_length=2048).settings()
        for p in ("transformer_xl", "memorizing_transformer", "unimix", "trams")
    }
    sizes = (s["transformer_xl"].memory_size, s["memorizing_transformer"].memory_size, s["unimix"].memory_size)
    assert sizes == (2048, 20480, 20480)
    assert s["unimix"].memory_tokens == 40
    assert (s["unimix"].window, s["unimix"].global_tokens, s["unimix"].topk) == (2048, 4, 4)
    assert s["memorizing_transformer"].layers(22) == (11, 21) and s["unimix"].layers(22) == tuple(range(11, 22))
    assert s["memorizing_transformer"].topk == 32 and s["transformer_xl"].layers(22) == tuple(range(22))
    trams = ha.TRAMSConfig(memory_size=400, select_size=200).settings()
    assert (trams.memory_size, trams.select_size, trams.recent_keep, trams.positions) == (400, 200, 150, "compact")
    assert ha.TRAMSConfig(segment_length=64) == ha.UniMemConfig(preset="trams", segment_length=64)
    model = ha.wrap_with_memory(tiny_backbone("llama"), ha.TRAMSConfig(segment_length=L))
    assert model.method == "trams" and model.memory.settings.memory_size == 8 * L


def test_errors_name_the_wrong_values():
    with pytest.raises(ValueError, match=r"`select_size` \(9\) must not exceed `memory_size` \(8\)"):
        ha.TRAMSConfig(memory_size=8, select_size=9)
    for preset in ("memorizing_transformer", "unimix"):
        with pytest.raises(ValueError, match=r"`topk` \(100\) must not exceed `memory_size` \(32\)"):
            ha.UniMemConfig(preset=preset, memory_size=32, topk=100)
    # a preset's own k is at most the store (a short segment's 10 x L slots hold fewer than 32)
    assert ha.UniMemConfig(preset="memorizing_transformer", segment_length=2).settings().topk == 20
    with pytest.raises(ValueError, match=r"`recent_keep` must be in \[0, `select_size`=4\], got 5"):
        ha.TRAMSConfig(memory_size=8, select_size=4, recent_keep=5)
    with pytest.raises(ValueError, match=r"`memory_layers` must lie in \[0, 1\] for this 2-layer backbone, got \[2\]"):
        ha.wrap_with_memory(tiny_backbone("llama"), "memorizing_transformer", segment_length=L, memory_layers=[2])
    with pytest.raises(ValueError, match=r"`topk` applies to reading \['topk', 'union'\], but `reading` is 'trams'"):
        ha.TRAMSConfig(topk=3)
    with pytest.raises(
        ValueError, match=r"`positions`='compact' needs a reading in \['all', 'window', 'trams'\].*'topk'"
    ):
        ha.UniMemConfig(preset="memorizing_transformer", positions="compact")
    with pytest.raises(
        ValueError, match=r"`reading` must be one of \['all', 'window', 'global', 'topk', 'union', 'trams'\]"
    ):
        ha.UniMemConfig(reading="knn")
    with pytest.raises(ValueError, match=r"window of 88 positions"):
        ha.wrap_with_memory(tiny_backbone("llama"), "unimix", segment_length=8)  # 40 RMT tokens read + written
    for method in ("trams", "memorizing_transformer", "unimix"):
        with pytest.raises(NotImplementedError, match=f"'{method}' injects memory into attention layers.*'mamba'"):
            ha.wrap_with_memory(tiny_backbone("mamba"), method, segment_length=L)
