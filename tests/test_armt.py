"""ARMT's associative memory (Rodkin et al. 2024): an untrained wrap is the bare backbone exactly, the write is the
delta rule, a written key is read back, and padding writes nothing."""

from __future__ import annotations

import torch

import hmt_adapters as ha
from cases import SEGMENT
from hmt_adapters.method import Layout, Segment
from hmt_adapters.methods.armt.method import AssociativeWindow, dpfp, rms_normed
from tiny import random_ids, tiny_backbone


def wrap(**fields) -> ha.MemoryModel:
    return ha.wrap_with_memory(tiny_backbone("llama"), "armt", segment_length=SEGMENT, key_size=4, **fields).eval()


def test_untrained_it_is_the_bare_backbone_exactly_on_every_segment():
    model = wrap()
    ids = random_ids(2, 4 * SEGMENT + 3)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        _, state = model.step(ids)
        for s in range(0, ids.shape[1], SEGMENT):
            bare = model.base_model(input_ids=ids[:, s : s + SEGMENT]).logits
            assert torch.equal(logits[:, s : s + SEGMENT], bare)
    assert any(bool(state.tensors[f"A.{i}"].abs().sum() > 0) for i in model.memory.memory_layers)  # written, unread


def test_the_write_is_the_delta_rule_of_every_real_token():
    model = wrap(read_init_std=0.1)
    memory, layer = model.memory, 0
    state = memory.init_state(2, torch.device("cpu"), torch.float32)
    outputs = torch.randn(2, SEGMENT, memory.backbone.config.hidden_size)
    mask = torch.ones(2, SEGMENT, dtype=torch.long)
    mask[1, :3] = 0  # padding writes nothing
    segment = Segment(torch.zeros(2, SEGMENT, dtype=torch.long), mask, 0, None)
    window = AssociativeWindow(owner=memory, outputs={i: [outputs] for i in memory.memory_layers})
    for _ in range(2):  # the second write sees the first in v_old
        before = state
        state = memory.update(segment, state, Layout(attention=window), outputs)
    A, z = before[f"A.{layer}"], before[f"z.{layer}"]
    h = rms_normed(outputs)
    k = memory.features(memory.key[str(layer)](h))
    v = memory.value[str(layer)](h)
    beta = torch.sigmoid(memory.beta[str(layer)](h))[..., 0]
    for b in range(2):  # token by token, as ARMT eq. 2-4 write it
        expected_A, expected_z = A[b].clone(), z[b].clone()
        for t in range(SEGMENT):
            if not mask[b, t]:
                continue
            v_old = (k[b, t] @ A[b]) / (k[b, t] @ z[b] + 1e-5)
            expected_A += beta[b, t] * torch.outer(k[b, t], v[b, t] - v_old)
            expected_z += k[b, t]
        torch.testing.assert_close(state[f"A.{layer}"][b], expected_A, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(state[f"z.{layer}"][b], expected_z, atol=1e-5, rtol=1e-5)


def test_a_key_written_alone_is_read_back_as_its_value():
    model = wrap(read_init_std=0.1)
    memory, layer = model.memory, 0
    with torch.no_grad():
        memory.beta[str(layer)].bias.fill_(30.0)  # beta = 1: the value is written whole
    hidden = torch.randn(1, 1, memory.backbone.config.hidden_size)
    segment = Segment(torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.long), 0, None)
    window = AssociativeWindow(owner=memory, outputs={i: [hidden] for i in memory.memory_layers})
    state = memory.init_state(1, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        state = memory.update(segment, state, Layout(attention=window), hidden)
        read = AssociativeWindow(owner=memory, memory={layer: (state[f"A.{layer}"], state[f"z.{layer}"])})
        out = memory.read(layer, hidden, read) - hidden  # W_o of what the query finds
        value = memory.value[str(layer)](rms_normed(hidden))  # the query is the key (tied init): A^T phi(k) / z.phi(k)
    torch.testing.assert_close(out, memory.out[str(layer)](value), atol=1e-4, rtol=1e-3)


def test_dpfp_features_are_non_negative_and_as_wide_as_the_config_says():
    x = torch.randn(3, 5, 4)
    phi = dpfp(x, 3)
    assert phi.shape == (3, 5, 2 * 3 * 4) and bool((phi >= 0).all())
    assert ha.ARMTConfig(key_size=4).features == 24 and ha.ARMTConfig(key_size=4, feature_map="elu").features == 4
