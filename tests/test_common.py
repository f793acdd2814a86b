"""Behaviour every method shares, on every backbone family it supports (tiny random models, fp32, CPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hmt_adapters as ha
from cases import CAUSAL_PER_SEGMENT, METHOD_CASES, SEGMENT, cases, has_parameters, trains_through_memory, wrap
from tiny import ATTENTION_FAMILIES, FAMILIES, MAX_POSITIONS, VOCAB, random_ids, tiny_backbone

CASES = cases()


def test_the_matrix_covers_every_registered_method():
    """A method registered without a case here would skip every shared contract below (docs/architecture.md,
    "Adding a method")."""
    assert sorted(METHOD_CASES) == ha.available_methods()


def hand_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF causal-LM loss over the concatenated logits: position t predicts labels[t + 1]."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("method,family", CASES)
def test_logits_cover_every_token_and_loss_is_causal_lm_loss(method, family):
    model = wrap(method, family)
    ids = random_ids(2, 3 * SEGMENT + 5)  # ragged final segment
    labels = ids.clone()
    labels[0, 4] = -100
    labels[1, SEGMENT] = -100  # a first token of a segment: its cross-boundary prediction is skipped
    out = model(input_ids=ids, labels=labels)
    assert out.logits.shape == (2, ids.shape[1], VOCAB)
    assert torch.allclose(out.loss, hand_loss(out.logits, labels), atol=1e-6)
    assert int(out.num_tokens) == int((labels[:, 1:] != -100).sum())


@pytest.mark.parametrize("method,family", cases(has_parameters))
def test_gradients_reach_every_memory_parameter_and_no_backbone_weight(method, family):
    model = wrap(method, family)
    ids = random_ids(2, 4 * SEGMENT)
    model(input_ids=ids, labels=ids).loss.backward()
    params = dict(model.memory.named_parameters())
    assert params, "the method has no memory parameters"
    for name, p in params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reaches {name}"
    assert all(p.grad is None for p in model.base_model.parameters())
    assert {id(p) for p in model.memory_parameters()} == {id(p) for p in params.values()}


@pytest.mark.parametrize("method,family", CASES)
def test_streaming_chunks_equal_one_forward(method, family):
    model = wrap(method, family).eval()
    ids = random_ids(2, 5 * SEGMENT + 3)
    with torch.no_grad():
        full = model(input_ids=ids).logits
        state, parts, start = model.init_memory(2), [], 0
        sizes = (8, 16, 8, 8, 3) if method in CAUSAL_PER_SEGMENT else (5, 9, 3, 1, 8, 11, 6)
        for size in sizes:
            out, state = model.step(ids[:, start : start + size], state)
            parts.append(out.logits)
            start += size
    assert start == ids.shape[1]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-4)
    assert state.segments_seen == ids.shape[1] // SEGMENT and state.pending_length == ids.shape[1] % SEGMENT


@pytest.mark.parametrize("method,family", CASES)
def test_no_logit_depends_on_a_later_token(method, family):
    model = wrap(method, family).eval()
    ids = random_ids(1, 4 * SEGMENT)
    cuts = (3, SEGMENT - 1, SEGMENT, 2 * SEGMENT + 2, 3 * SEGMENT + 1)
    if method in CAUSAL_PER_SEGMENT:  # changes start at the next segment (tests/cases.py says why)
        cuts = tuple(sorted({-(-(t + 1) // SEGMENT) * SEGMENT - 1 for t in cuts} - {ids.shape[1] - 1}))
    with torch.no_grad():
        base = model(input_ids=ids).logits
        for t in cuts:
            changed = ids.clone()
            changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % VOCAB
            after = model(input_ids=changed).logits
            torch.testing.assert_close(after[:, : t + 1], base[:, : t + 1], atol=1e-5, rtol=1e-4)
            assert not torch.allclose(after[:, t + 1 :], base[:, t + 1 :])


@pytest.mark.parametrize("method,family", CASES)
def test_memory_carries_information_from_segment_zero(method, family):
    model = wrap(method, family).eval()
    ids = random_ids(1, 3 * SEGMENT)
    changed = ids.clone()
    changed[:, :SEGMENT] = (changed[:, :SEGMENT] + 5) % VOCAB  # beyond the sensory window of segment 2
    with torch.no_grad():
        a = model(input_ids=ids).logits[:, 2 * SEGMENT :]
        b = model(input_ids=changed).logits[:, 2 * SEGMENT :]
        with model.disable_memory():
            c = model(input_ids=ids).logits[:, 2 * SEGMENT :]
            d = model(input_ids=changed).logits[:, 2 * SEGMENT :]
    assert (a - b).abs().max() > 1e-6  # tiny random models: small but real (disabled memory gives exactly 0)
    torch.testing.assert_close(c, d)


@pytest.mark.parametrize("family", FAMILIES)
def test_disabled_memory_equals_the_backbone_on_each_segment(family):
    model = wrap("hmt", family).eval()
    ids = random_ids(2, 2 * SEGMENT + 3)
    with torch.no_grad(), model.disable_memory():
        logits = model(input_ids=ids).logits
    with torch.no_grad():
        for s in range(0, ids.shape[1], SEGMENT):
            ref = model.base_model(input_ids=ids[:, s : s + SEGMENT]).logits
            torch.testing.assert_close(logits[:, s : s + SEGMENT], ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method,family", CASES)
def test_save_load_round_trip_gives_identical_logits(method, family, tmp_path):
    model = wrap(method, family).eval()
    with torch.no_grad():
        for p in model.memory_parameters():
            p.add_(torch.randn_like(p))  # "trained" weights, not the init
    ids = random_ids(2, 3 * SEGMENT)
    model.save_pretrained(tmp_path)
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone(family), str(tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=0, rtol=0)
    assert loaded.memory_config == model.memory_config


@pytest.mark.parametrize("method,family", CASES)
def test_documents_twenty_times_the_backbone_positions_run_with_bounded_positions(method, family):
    model = wrap(method, family).eval()
    ids = random_ids(1, 20 * MAX_POSITIONS)
    seen = []
    if family in ATTENTION_FAMILIES:
        model.adapter.body_module.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(int(kwargs["position_ids"].max())), with_kwargs=True
        )
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    assert out.logits.shape[1] == ids.shape[1] and torch.isfinite(out.loss)
    if family in ATTENTION_FAMILIES:
        assert len(seen) >= ids.shape[1] // SEGMENT
        assert max(seen) < SEGMENT + model.memory.window_slots() <= MAX_POSITIONS


@pytest.mark.parametrize("method,family", cases(trains_through_memory))
def test_bptt_depth_stops_gradients(method, family):
    ids = random_ids(2, 4 * SEGMENT)
    labels = torch.full_like(ids, -100)
    labels[:, -SEGMENT:] = ids[:, -SEGMENT:]  # loss on the last segment only
    grads = {}
    for depth in (None, 1):
        model = wrap(method, family, bptt_depth=depth)
        model(input_ids=ids, labels=labels).loss.backward()
        grads[depth] = model.memory.memory_init.grad
    assert grads[None] is not None and grads[None].abs().sum() > 0
    assert grads[1] is None or grads[1].abs().sum() == 0
