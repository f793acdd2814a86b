"""Elastic Memory on tiny models: exact first segment, the memory really reaches attention as `R C`, the state is
the HiPPO compression of the layer's pre-RoPE keys/values, padding, constant size, gradients, switchable sampling."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.attention import AttentionCall
from hmt_adapters.methods.elastic import HiPPOLegS
from hmt_adapters.methods.elastic.method import default_memory_layer
from hmt_adapters.methods.elastic.sampling import sample_points
from tiny import VOCAB, random_ids, tiny_backbone

SEG, N, L_MEM = 8, 8, 6


def elastic(family: str = "llama", **overrides) -> ha.MemoryModel:
    kwargs = {"segment_length": SEG, "hippo_order": N, "memory_tokens": L_MEM, **overrides}
    return ha.wrap_with_memory(tiny_backbone(family), "elastic", **kwargs)


def layer_inputs(model: ha.MemoryModel, layer: int) -> list[torch.Tensor]:
    """Collects the input hidden states of decoder layer `layer` at every call."""
    seen = []
    model.adapter.decoder_layers[layer].register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True
    )
    return seen


@pytest.mark.parametrize("family", ["llama", "opt", "gpt2"])
def test_first_segment_equals_the_bare_backbone_exactly(family):
    model = elastic(family).eval()
    ids = random_ids(2, 3 * SEG)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        ref = model.base_model(input_ids=ids[:, :SEG]).logits
    torch.testing.assert_close(logits[:, :SEG], ref, atol=0, rtol=0)


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_memory_reaches_attention_as_the_reconstruction_of_the_state(family, monkeypatch):
    """Fails if the memory tokens stop reaching the layer, reach the wrong layer, or are not `R_t C` (Eq. 8)."""
    calls = []
    original = AttentionCall.run_with_prefix

    def spy(self, mem_k, mem_v, visible=None):
        calls.append((self.layer, mem_k, mem_v))
        return original(self, mem_k, mem_v, visible)

    monkeypatch.setattr(AttentionCall, "run_with_prefix", spy)
    model = elastic(family).eval()
    layer = model.memory.layers[0]
    ids = random_ids(1, 4 * SEG)
    state = model.init_memory(1)
    with torch.no_grad():
        for n in range(4):
            before = state.tensors
            _, state = model.step(ids[:, n * SEG : (n + 1) * SEG], state)
            if n == 0:
                assert calls == []  # no memory before anything was folded in
                continue
            assert [c[0] for c in calls] == [layer]
            t = n * SEG  # tokens folded into the state: the horizon it is read with (docs/elastic_memory.md)
            R = HiPPOLegS(N).basis(sample_points("uniform", t, L_MEM, N), t)[None]
            torch.testing.assert_close(calls[0][1], R[:, None] @ before[f"k.{layer}"])
            torch.testing.assert_close(calls[0][2], R[:, None] @ before[f"v.{layer}"])
            assert calls[0][1].shape == (1, model.adapter.num_kv_heads, L_MEM, model.adapter.head_dim)
            calls.clear()
        with_memory = model(input_ids=ids).logits
        with model.disable_memory():
            without = model(input_ids=ids).logits
    assert (with_memory[:, SEG:] - without[:, SEG:]).abs().max() > 1e-4


def test_state_is_the_hippo_compression_of_the_layers_pre_rope_keys_and_values():
    model = elastic("llama").eval()  # 2 layers: memory in layer 1, whose inputs memory does not change
    inputs = layer_inputs(model, 1)
    ids = random_ids(2, 3 * SEG)
    with torch.no_grad():
        _, state = model.step(ids)
        keys, values = zip(*(model.adapter.layer_kv(1, h) for h in inputs))
    hippo = HiPPOLegS(N)
    for name, seq in (("k.1", torch.cat(keys, dim=2)), ("v.1", torch.cat(values, dim=2))):
        expected = hippo.compress(seq.transpose(-1, -2)).transpose(-1, -2)  # channels compressed along tokens
        torch.testing.assert_close(state.tensors[name], expected, atol=1e-5, rtol=1e-4)
    assert state.tensors["length"].tolist() == [3 * SEG, 3 * SEG]
    assert state.tensors["k.1"].dtype == torch.float32


def test_masked_tokens_neither_enter_the_memory_nor_advance_its_clock():
    model = elastic("llama").eval()
    ids = random_ids(2, 3 * SEG)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[1, SEG + 2 : SEG + 5] = 0  # a hole inside segment 1
    other = ids.clone()
    other[mask == 0] = (other[mask == 0] + 11) % VOCAB  # different tokens under the mask
    with torch.no_grad():
        a, state_a = model.step(ids, attention_mask=mask)
        b, state_b = model.step(other, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(a.logits[real], b.logits[real], atol=1e-5, rtol=1e-4)
    for name in state_a.tensors:
        torch.testing.assert_close(state_a.tensors[name], state_b.tensors[name], atol=1e-6, rtol=1e-5)
    assert state_a.tensors["length"].tolist() == [3 * SEG, 2 * SEG]  # row 1's 18 real tokens close 2 segments
    assert state_a.pending_mask.sum(1).tolist() == [0, 2]  # ... and leave 2 pending


def test_the_state_of_a_masked_row_is_the_compression_of_its_real_tokens_only():
    model = elastic("llama").eval()
    ids = random_ids(2, 2 * SEG + 3)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[0, SEG + 1] = 0  # row 0: 2 * SEG real tokens, read from the first one
    with torch.no_grad():
        _, state = model.step(ids, attention_mask=mask)
    inputs = layer_inputs(model, 1)
    with torch.no_grad():
        model.step(ids[:1, mask[0].bool()])  # the row's real tokens alone, in order
        keys = torch.cat([model.adapter.layer_kv(1, h)[0] for h in inputs], dim=2)  # [1, H, 16, D]
    expected = HiPPOLegS(N).compress(keys[0].transpose(-1, -2)).transpose(-1, -2)
    torch.testing.assert_close(state.tensors["k.1"][0], expected, atol=1e-5, rtol=1e-4)


def test_memory_size_is_constant_over_a_thousand_segments():
    model = elastic("llama", segment_length=2).eval()
    state, shapes = model.init_memory(1), set()
    with torch.no_grad():
        for chunk in range(10):
            _, state = model.step(random_ids(1, 200, seed=chunk), state)
            shapes.add(tuple((k, tuple(v.shape)) for k, v in sorted(state.tensors.items())))
    assert state.segments_seen == 1000 and len(shapes) == 1 and int(state.tensors["length"]) == 2000
    cache = model.memory.hippo.cache
    assert cache.max_bytes == 64 << 20 and 0 < cache.nbytes <= cache.max_bytes


def test_the_matrix_cache_changes_speed_only():
    ids = random_ids(2, 5 * SEG)
    cached, uncached = elastic(), elastic(matrix_cache_mb=0)
    uncached.load_state_dict(cached.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(uncached(input_ids=ids).logits, cached(input_ids=ids).logits, atol=0, rtol=0)
    assert len(uncached.memory.hippo.cache) == 0 and len(cached.memory.hippo.cache) > 0
    with pytest.raises(ValueError, match="matrix_cache_mb"):
        elastic(matrix_cache_mb=-1)


def test_no_new_trainable_parameters_or_weights():
    base = tiny_backbone("llama")
    count = sum(p.numel() for p in base.parameters())
    model = ha.wrap_with_memory(base, "elastic", segment_length=SEG, hippo_order=N)
    assert list(model.memory_parameters()) == [] and model.memory.state_dict() == {}
    assert sum(p.numel() for p in model.base_model.parameters()) == count


def test_gradients_reach_earlier_segments_through_the_state_and_bptt_depth_cuts_them():
    first = torch.randint(0, VOCAB // 2, (1, SEG))
    rest = torch.randint(VOCAB // 2, VOCAB, (1, 4 * SEG))
    ids = torch.cat([first, rest], dim=1)
    labels = torch.full_like(ids, -100)
    labels[:, -SEG:] = ids[:, -SEG:]  # loss on the last segment only
    grads = {}
    for depth in (None, 1):
        model = elastic("llama", bptt_depth=depth)
        model.base_model.requires_grad_(True)
        model(input_ids=ids, labels=labels).loss.backward()
        grads[depth] = model.base_model.get_input_embeddings().weight.grad[first.unique()].abs().sum()
    assert grads[None] > 0 and grads[1] == 0


def test_sampling_switches_after_training_without_touching_the_state(tmp_path):
    model = elastic("llama").eval()
    ids = random_ids(1, 3 * SEG)
    model.save_pretrained(tmp_path)
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), str(tmp_path), sampling="exponential").eval()
    with torch.no_grad():
        out_uni, state_uni = model.step(ids)
        out_exp, state_exp = loaded.step(ids)
    for name in state_uni.tensors:
        assert torch.equal(state_uni.tensors[name], state_exp.tensors[name])  # C does not depend on the readout
    torch.testing.assert_close(out_exp.logits[:, :SEG], out_uni.logits[:, :SEG], atol=0, rtol=0)
    assert (out_exp.logits[:, SEG:] - out_uni.logits[:, SEG:]).abs().max() > 1e-5
    model.memory.set_sampling("exponential")
    with torch.no_grad():
        torch.testing.assert_close(model.step(ids)[0].logits, out_exp.logits, atol=0, rtol=0)
    assert model.memory_config.sampling == "exponential"
    with pytest.raises(ValueError, match=r"`sampling` must be one of \['uniform', 'exponential'\], got 'random'"):
        model.memory.set_sampling("random")


def test_sample_points_follow_the_paper_and_the_documented_defaults():
    t, count, order = 64, 8, 16
    torch.testing.assert_close(sample_points("uniform", t, count, order), torch.arange(8, dtype=torch.float64) * 8)
    x = sample_points("exponential", t, count, order)
    assert x[-1] == 0 and abs(float(x[0]) - (t - t / order)) < 1e-9  # newest one resolution cell before t
    assert bool((x[:-1] > x[1:]).all()) and bool(((x[:-2] - x[1:-1]) < (x[1:-1] - x[2:])).all())  # denser near t
    torch.testing.assert_close(
        sample_points("exponential", t, 3, order, alpha=0.5), torch.tensor([48.0, 32.0, 0.0], dtype=torch.float64)
    )


def test_default_memory_layer_is_at_three_quarters_depth():
    assert [default_memory_layer(n) for n in (1, 2, 4, 12, 32)] == [0, 1, 2, 8, 23]
    assert elastic("llama").memory.layers == (1,)


def test_state_stays_float32_under_a_bfloat16_backbone():
    base = tiny_backbone("llama").to(torch.bfloat16)
    model = ha.wrap_with_memory(base, "elastic", segment_length=SEG, hippo_order=N).eval()
    with torch.no_grad():
        out, state = model.step(random_ids(1, 3 * SEG))
    assert state.tensors["k.1"].dtype == torch.float32 and torch.isfinite(out.logits).all()


def test_bad_settings_are_errors_that_name_the_value():
    with pytest.raises(ValueError, match=r"`memory_layers` must lie in \[0, 1\] for this 2-layer backbone, got \[4\]"):
        elastic("llama", memory_layers=[4])
    with pytest.raises(ValueError, match=r"`exp_alpha` must lie in the open interval \(0, 1\) or be None, got 1.0"):
        ha.ElasticMemoryConfig(exp_alpha=1.0)
    with pytest.raises(ValueError, match=r"`hippo_order` must be in \[1, inf\], got 0"):
        ha.ElasticMemoryConfig(hippo_order=0)
    with pytest.raises(NotImplementedError, match="'elastic' injects memory into attention layers.*'mamba'"):
        ha.wrap_with_memory(tiny_backbone("mamba"), "elastic", segment_length=SEG)


@pytest.mark.parametrize("count", [6, 8, 13])
def test_the_one_uniform_readout_is_the_readout_at_every_length(count):
    """Uniform points sit at 2j/L_mem - 1 of the Legendre interval for any t, so one matrix serves every state."""
    model = elastic(memory_tokens=count)
    hippo = HiPPOLegS(N)
    one = model.memory._readout_at(1, torch.device("cpu"))
    for t in (1, 7, 8, 100, 12345):
        torch.testing.assert_close(model.memory._readout_at(t, torch.device("cpu")), one, atol=0, rtol=0)
        per_length = hippo.basis(sample_points("uniform", t, count, N), t)
        torch.testing.assert_close(one, per_length, atol=2e-6, rtol=1e-6)
