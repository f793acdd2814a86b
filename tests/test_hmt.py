"""HMT specifics (HMT §3): reductions, layout, retrieval maths, padding, stage hand-over."""

from __future__ import annotations

import math

import pytest
import torch

import hmt_adapters as ha
from tiny import VOCAB, random_ids, tiny_backbone

L, K, N, DH = 8, 3, 4, 16


def hmt(family="llama", seed=0, **kw) -> ha.MemoryModel:
    cfg = dict(segment_length=L, sensory_length=K, memory_window=N, retrieval_dim=DH)
    return ha.wrap_with_memory(tiny_backbone(family, seed), "hmt", **{**cfg, **kw}).eval()


def body_calls(model):
    """Record the `inputs_embeds` width of every backbone call."""
    widths = []
    model.adapter.body_module.register_forward_pre_hook(
        lambda mod, args, kwargs: widths.append(kwargs["inputs_embeds"].shape[1]), with_kwargs=True
    )
    return widths


def test_stage_one_without_sensory_memory_is_rmt_with_one_memory_token():
    model = hmt(use_retrieval=False, sensory_length=0)
    rmt = ha.wrap_with_memory(model.base_model, "rmt", segment_length=L, num_memory_tokens=1).eval()
    rmt.memory.memory_init.data.copy_(model.memory.memory_init.data)
    ids = random_ids(2, 4 * L + 3)
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, rmt(input_ids=ids).logits, atol=0, rtol=0)


def test_retrieval_over_a_window_of_one_equals_stage_one():
    stage2 = hmt(memory_window=1)
    stage1 = ha.wrap_with_memory(stage2.base_model, stage2.memory_config.replace(use_retrieval=False)).eval()
    stage1.memory.memory_init.data.copy_(stage2.memory.memory_init.data)
    ids = random_ids(2, 5 * L)
    with torch.no_grad():
        torch.testing.assert_close(stage2(input_ids=ids).logits, stage1(input_ids=ids).logits, atol=0, rtol=0)


def test_single_segment_equals_backbone_on_memory_prompt_segment_prompt():
    model = hmt()
    ids = random_ids(2, L)
    emb = model.base_model.get_input_embeddings()(ids)
    prompt = model.memory.memory_init.expand(2, 1, -1)
    with torch.no_grad():
        ref = model.base_model(inputs_embeds=torch.cat([prompt, emb, prompt], dim=1)).logits[:, 1 : L + 1]
        torch.testing.assert_close(model(input_ids=ids).logits, ref, atol=1e-6, rtol=1e-5)


def test_window_layout_and_one_batched_summary_call():
    model = hmt()
    widths = body_calls(model)
    ids = random_ids(2, 5 * L)
    with torch.no_grad():
        model(input_ids=ids)
    j = L // 2
    # one summary call for all segments that retrieve, then the main passes: [P] + L + [P], then k sensory more
    assert widths == [j + 2, L + 2] + [L + K + 2] * 4


def test_sensory_slots_hold_the_previous_segments_last_tokens():
    model = hmt(use_retrieval=False)
    seen = []
    model.adapter.body_module.register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["inputs_embeds"]), with_kwargs=True
    )
    ids = random_ids(1, 3 * L)
    with torch.no_grad():
        model(input_ids=ids)
        emb = model.base_model.get_input_embeddings()(ids)
    for n in (1, 2):
        window = seen[n]
        torch.testing.assert_close(window[:, 1 : K + 1], emb[:, n * L - K : n * L])
        torch.testing.assert_close(window[:, 0], window[:, -1])  # both P slots hold the same prompt


def test_cache_holds_the_last_n_memory_embeddings_oldest_first():
    model = hmt()
    ids = random_ids(2, 7 * L)
    outputs = []
    state = model.init_memory(2)
    with torch.no_grad():
        for n in range(7):
            state_before = state
            _, state = model.step(ids[:, n * L : (n + 1) * L], state)
            outputs.append(state.tensors["cache"][:, -1])
            valid = state.tensors["cache_valid"]
            assert int(valid[0].sum()) == min(n + 1, N)
            assert state.tensors["cache"].shape == state_before.tensors["cache"].shape
    torch.testing.assert_close(state.tensors["cache"], torch.stack(outputs[-N:], dim=1))


def test_memory_size_is_constant_over_a_thousand_segments():
    model = hmt()
    state = model.init_memory(1)
    sizes = set()
    with torch.no_grad():
        for chunk in range(100):
            _, state = model.step(random_ids(1, 10 * L, seed=chunk), state)
            sizes.add(tuple((k, tuple(v.shape)) for k, v in sorted(state.tensors.items())))
    assert state.segments_seen == 1000 and len(sizes) == 1


def test_retrieval_matches_a_float64_hand_computation():
    torch.manual_seed(1)
    retrieval = ha.methods.hmt.method.MemoryRetrieval(6, 5).double()
    summary, cache = torch.randn(3, 6, dtype=torch.float64), torch.randn(3, 4, 6, dtype=torch.float64)
    valid = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.bool)
    q = summary @ retrieval.query.weight.T
    k = cache @ retrieval.key.weight.T
    scores = torch.einsum("bh,bnh->bn", q, k) / math.sqrt(5)
    weights = torch.softmax(scores.masked_fill(~valid, -math.inf), dim=-1)
    torch.testing.assert_close(retrieval(summary, cache, valid), torch.einsum("bn,bnd->bd", weights, cache))
    torch.testing.assert_close(retrieval(summary, cache, valid)[2], cache[2, 3])  # one valid entry: exactly it
    same = cache[:, :1].expand_as(cache)
    torch.testing.assert_close(retrieval(summary, same, valid), cache[:, 0])  # identical entries: that entry


def test_two_segments_give_retrieval_exactly_zero_gradient():
    model = hmt()
    model.train()
    ids = random_ids(2, 2 * L)
    model(input_ids=ids, labels=ids).loss.backward()
    m = model.memory
    assert m.memory_init.grad.abs().sum() > 0
    for p in (m.summary_prompt, m.retrieval.query.weight, m.retrieval.key.weight):
        assert p.grad is None or p.grad.abs().sum() == 0  # a one-entry softmax has weight exactly 1


def test_paper_query_leaks_within_a_segment_and_the_causal_query_does_not():
    ids = random_ids(1, 4 * L)
    t = 2 * L + 3  # inside segment 2, before j = L // 2
    changed = ids.clone()
    changed[:, t] = (changed[:, t] + 1) % VOCAB
    for source, leaks in (("segment_prefix", True), ("previous_suffix", False)):
        model = hmt(query_source=source)
        with torch.no_grad():
            for w in (model.memory.retrieval.query.weight, model.memory.retrieval.key.weight):
                w.mul_(30.0)  # sharpen the random retrieval so the query's influence is visible
            a, b = model(input_ids=ids).logits, model(input_ids=changed).logits
        earlier = (a[:, 2 * L : t] - b[:, 2 * L : t]).abs().max()
        assert (earlier > 1e-6) == leaks, (source, float(earlier))


@pytest.mark.parametrize("family", ["llama", "opt", "mamba"])
def test_left_padding_by_whole_segments_reproduces_the_unpadded_row(family):
    model = hmt(family)
    ids = random_ids(2, 4 * L)
    short = ids[1:, L + 2 :]  # row 1 without its first 10 tokens: left-pad with whole segments
    pad = torch.zeros(1, 2 * L, dtype=torch.long)
    batch = torch.cat([ids[:1, :], torch.cat([pad, short[:, -2 * L :]], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, : 2 * L] = 0
    with torch.no_grad():
        padded = model(input_ids=batch, attention_mask=mask).logits
        alone = model(input_ids=short[:, -2 * L :]).logits
        first = model(input_ids=ids[:1]).logits
    torch.testing.assert_close(padded[1:, 2 * L :], alone, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(padded[:1], first, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_right_padding_leaves_the_real_tokens_unchanged(family):
    model = hmt(family)
    ids = random_ids(2, 3 * L + 2)
    mask = torch.ones_like(ids)
    mask[1, 2 * L + 1 :] = 0
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=ids[1:, : 2 * L + 1]).logits
    torch.testing.assert_close(padded[1:, : 2 * L + 1], alone, atol=1e-5, rtol=1e-4)


def test_rows_do_not_influence_each_other():
    model = hmt()
    ids = random_ids(3, 3 * L)
    with torch.no_grad():
        batch = model(input_ids=ids).logits
        for r in range(3):
            torch.testing.assert_close(batch[r : r + 1], model(input_ids=ids[r : r + 1]).logits, atol=1e-5, rtol=1e-4)


def test_added_parameters_are_two_embeddings_and_two_projections():
    model = hmt(family="opt")
    d = model.adapter.embed_dim
    assert d == 16  # OPT: word_embed_proj_dim, not hidden_size
    assert sum(p.numel() for p in model.memory_parameters()) == 2 * d + 2 * d * DH
    stage1 = hmt(use_retrieval=False)
    assert [n for n, _ in stage1.memory.named_parameters()] == ["memory_init"]


def test_stage_one_adapter_loads_into_stage_two_with_exactly_the_retrieval_weights_new(tmp_path):
    stage1 = hmt(use_retrieval=False)
    with torch.no_grad():
        stage1.memory.memory_init.add_(1.0)
    stage1.save_pretrained(tmp_path)
    stage2 = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path), use_retrieval=True, memory_window=1)
    assert stage2.loading_info["missing_keys"] == ["retrieval.key.weight", "retrieval.query.weight", "summary_prompt"]
    ids = random_ids(2, 4 * L)
    with torch.no_grad():
        torch.testing.assert_close(stage2.eval()(input_ids=ids).logits, stage1(input_ids=ids).logits, atol=0, rtol=0)
