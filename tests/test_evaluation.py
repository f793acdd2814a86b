"""Corpus perplexity: exp(total NLL / total predicted tokens), independent of batching and padding."""

from __future__ import annotations

import math

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.training import (
    corpus_nll,
    perplexity,
    perplexity_by_length,
    perplexity_ratio,
    sliding_window_nll,
    token_nll,
)
from tiny import random_ids, tiny_backbone


def test_corpus_perplexity_is_token_weighted_and_batching_does_not_change_it():
    model = ha.wrap_with_memory(
        tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2, memory_window=4
    ).eval()
    windows = [random_ids(1, n, seed=n)[0].tolist() for n in (30, 17, 24)]
    nll, tokens = corpus_nll(model, windows, batch_size=1)
    assert tokens == sum(len(w) - 1 for w in windows)
    batched, batched_tokens = corpus_nll(model, windows, batch_size=3)
    assert batched_tokens == tokens and batched == pytest.approx(nll, rel=1e-5)
    with torch.no_grad():
        manual = sum(
            float(model(input_ids=torch.tensor([w]), labels=torch.tensor([w])).loss) * (len(w) - 1) for w in windows
        )
    assert perplexity(model, windows) == pytest.approx(math.exp(manual / tokens), rel=1e-5)
    memory = perplexity(model, windows)
    with model.disable_memory():
        assert perplexity(model, windows) != pytest.approx(memory, rel=1e-6)  # the baseline reads segments alone
    with pytest.raises(ValueError, match="empty"):
        corpus_nll(model, [])


def test_token_nll_streams_the_document_and_matches_the_forward_loss():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2).eval()
    ids = random_ids(1, 29)[0]
    nll = token_nll(model, ids)
    assert nll.shape == (28,)
    with torch.no_grad():
        loss = model(input_ids=ids[None], labels=ids[None]).loss
    torch.testing.assert_close(nll.mean(), loss, atol=1e-5, rtol=1e-5)


def test_sliding_window_nll_gives_each_token_at_least_window_minus_stride_context():
    base = tiny_backbone("llama").eval()
    ids = random_ids(1, 30)[0]
    full = sliding_window_nll(base, ids, window=30, stride=30)
    with torch.no_grad():
        ref = torch.nn.functional.cross_entropy(base(input_ids=ids[None]).logits[0, :-1], ids[1:], reduction="none")
    torch.testing.assert_close(full, ref, atol=1e-5, rtol=1e-5)
    strided = sliding_window_nll(base, ids, window=12, stride=4)
    assert strided.shape == (29,)
    torch.testing.assert_close(strided[:11], ref[:11], atol=1e-5, rtol=1e-5)  # the first window scores everything
    with torch.no_grad():  # token 20 is scored by the window ending at 24 (tokens 12..23): its context is 12..19
        own = torch.nn.functional.cross_entropy(base(input_ids=ids[None, 12:20]).logits[0, -1:], ids[20:21])
    torch.testing.assert_close(strided[19], own, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r"`stride` must be in \[1, `window`=12\], got 13"):
        sliding_window_nll(base, ids, window=12, stride=13)


def test_sliding_window_nll_with_sinks_keeps_the_first_tokens_in_every_window():
    base = tiny_backbone("llama").eval()
    ids = random_ids(1, 30)[0]
    plain = sliding_window_nll(base, ids, window=12, stride=4)
    sinks = sliding_window_nll(base, ids, window=12, stride=4, sink_tokens=3)
    assert sinks.shape == (29,)
    torch.testing.assert_close(sinks[:11], plain[:11])  # the first window starts at token 0: nothing to add
    with torch.no_grad():  # token 20: the window ending at 24 holds tokens 0..2, then its last 9 (15..23)
        context = torch.cat([ids[:3], ids[15:20]])[None]
        own = torch.nn.functional.cross_entropy(base(input_ids=context).logits[0, -1:], ids[20:21])
    torch.testing.assert_close(sinks[19], own, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(sinks[19], plain[19])  # the sinks changed what token 20 saw
    with pytest.raises(ValueError, match=r"`sink_tokens` must be in \[0, `window` - `stride`=8\].*got 9"):
        sliding_window_nll(base, ids, window=12, stride=4, sink_tokens=9)


def test_perplexity_ratio_pairs_stretches_and_brackets_the_ratio():
    gen = torch.Generator().manual_seed(0)
    reference = (3 + torch.rand(64, generator=gen)).tolist()  # mean NLLs of 64 stretches of one text
    same = perplexity_ratio(reference, reference)
    assert same == pytest.approx((1.0, 1.0, 1.0))  # paired: the stretches' own spread cancels
    shifted = perplexity_ratio([x + 0.01 for x in reference], reference)
    assert shifted == pytest.approx((math.exp(0.01),) * 3)  # 1% worse on every stretch: no doubt about it
    noisy = [x + 0.1 * float(torch.randn(1, generator=gen)) for x in reference]
    ratio, low, high = perplexity_ratio(noisy, reference)
    diffs = torch.tensor(noisy) - torch.tensor(reference)
    assert ratio == pytest.approx(math.exp(float(diffs.mean())))
    half = 1.96 * float(diffs.std()) / 8  # the normal interval of a mean of 64
    assert low < ratio < high and (math.log(high) - math.log(low)) / 2 == pytest.approx(half, rel=0.2)
    assert perplexity_ratio(noisy, reference) == (ratio, low, high)  # seeded: a table renders the same twice
    with pytest.raises(ValueError, match="same number"):
        perplexity_ratio(noisy[:3], reference)
    with pytest.raises(ValueError, match="`level` must be in"):
        perplexity_ratio(noisy, reference, level=95)


def test_perplexity_by_length_bins_the_second_half_of_each_prefix():
    nll = torch.log(torch.arange(1, 16, dtype=torch.float))  # 15 targets of a 16-token document
    table = perplexity_by_length(nll, [4, 16, 32])
    assert sorted(table) == ["16", "4"]  # 32 is longer than the document
    assert table["4"]["bin"] == pytest.approx(math.exp(float(nll[1:3].mean())))
    assert table["16"]["prefix"] == pytest.approx(math.exp(float(nll.mean())))
