"""Where training signal flows through K/V memory (docs/attention_memory.md, "Training from scratch"): the
stop-gradient on stored keys/values cuts a loss at the end of a document off from its first segment; without it,
Transformer-XL covering the document trains exactly
like full attention, and every K/V reading rule passes gradient back to what it read."""

from __future__ import annotations

import pytest
import torch

import hmt_adapters as ha
from tiny import random_ids, tiny_backbone

L = 8


def last_segment_labels(ids: torch.Tensor) -> torch.Tensor:
    """Labels on the last segment only, as the recall task supervises just the answer."""
    labels = torch.full_like(ids, -100)
    labels[:, -L:] = ids[:, -L:]
    return labels


def first_segment_gradient(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Gradient of the last segment's loss with respect to the first segment's input embeddings."""
    captured: list[torch.Tensor] = []

    def keep_first(_module, _args, out):
        if not captured:
            out.retain_grad()
            captured.append(out)

    handle = model.get_input_embeddings().register_forward_hook(keep_first)
    try:
        model(input_ids=ids, labels=last_segment_labels(ids)).loss.backward()
    finally:
        handle.remove()
    grad = captured[0].grad
    return torch.zeros(()) if grad is None else grad[:, :L]


def test_xl_covering_the_document_without_stop_gradient_has_full_attentions_gradients():
    ids = random_ids(2, 5 * L)
    full = tiny_backbone("llama")
    full(input_ids=ids, labels=last_segment_labels(ids)).loss.backward()
    xl = ha.wrap_with_memory(
        tiny_backbone("llama"),
        "transformer_xl",
        segment_length=L,
        memory_size=4 * L,
        detach_memory=False,
        freeze_backbone=False,
    )
    xl(input_ids=ids, labels=last_segment_labels(ids)).loss.backward()
    reference = dict(full.named_parameters())
    for name, p in xl.backbone.named_parameters():
        torch.testing.assert_close(p.grad, reference[name].grad, atol=1e-6, rtol=1e-4, msg=name)
    assert xl.backbone.model.layers[0].self_attn.k_proj.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("method", ["transformer_xl", "trams", "memorizing_transformer"])
def test_stop_gradient_cuts_the_end_of_the_document_off_from_its_first_segment(method):
    """With the stores detached (the presets' default), nothing a later loss says reaches what segment 0 wrote."""
    ids = random_ids(2, 4 * L)
    common = dict(segment_length=L, memory_size=4 * L, freeze_backbone=False)
    detached = ha.wrap_with_memory(tiny_backbone("llama"), method, **common)
    assert float(first_segment_gradient(detached, ids).abs().max()) == 0.0
    attached = ha.wrap_with_memory(tiny_backbone("llama"), method, detach_memory=False, **common)
    assert float(first_segment_gradient(attached, ids).abs().max()) > 1e-4


def test_without_stop_gradient_the_key_segment_gets_full_attentions_gradient():
    ids = random_ids(2, 4 * L)
    full = tiny_backbone("llama")
    xl = ha.wrap_with_memory(
        tiny_backbone("llama"),
        "transformer_xl",
        segment_length=L,
        memory_size=4 * L,
        detach_memory=False,
        freeze_backbone=False,
    )
    expected = first_segment_gradient(full, ids)
    torch.testing.assert_close(first_segment_gradient(xl, ids), expected, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("memory_tokens,least_share", [(None, 0.4), (16, None)])
def test_elastic_reads_back_every_token_only_with_its_default_square_readout(memory_tokens, least_share):
    """With as many memory tokens as coefficients (the default), every token of a 72-token history but the newest
    is at least 0.4 of some memory token's weight; 16 uniform samples leave most tokens below 0.1 everywhere (the
    recall benchmark's old Elastic row, which could not read the key's digits back)."""
    model = ha.wrap_with_memory(
        tiny_backbone("llama"), "elastic", segment_length=L, hippo_order=64, memory_tokens=memory_tokens
    )
    history = 9 * L
    readout = model.memory.readout([history], torch.device("cpu"))[0].double()
    weights = (readout @ model.memory.hippo.kernel(0, history).double()).pow(2)  # [memory tokens, history]
    share = (weights / weights.sum(1, keepdim=True)).max(0).values  # per history token: its best memory token
    if least_share is not None:
        assert float(share[:-1].min()) > least_share
    else:
        assert float((share < 0.1).float().mean()) > 0.5
