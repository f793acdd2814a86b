"""Corpus perplexity: exp(total NLL / total predicted tokens), independent of batching and padding."""

from __future__ import annotations

import math

import pytest
import torch

import hmt_adapters as ha
from hmt_adapters.training import corpus_nll, perplexity
from tiny import random_ids, tiny_backbone


def test_corpus_perplexity_is_token_weighted_and_batching_does_not_change_it():
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8, sensory_length=2, memory_window=4).eval()
    windows = [random_ids(1, n, seed=n)[0].tolist() for n in (30, 17, 24)]
    nll, tokens = corpus_nll(model, windows, batch_size=1)
    assert tokens == sum(len(w) - 1 for w in windows)
    batched, batched_tokens = corpus_nll(model, windows, batch_size=3)
    assert batched_tokens == tokens and batched == pytest.approx(nll, rel=1e-5)
    with torch.no_grad():
        manual = sum(float(model(input_ids=torch.tensor([w]), labels=torch.tensor([w])).loss) * (len(w) - 1) for w in windows)
    assert perplexity(model, windows) == pytest.approx(math.exp(manual / tokens), rel=1e-5)
    memory = perplexity(model, windows)
    with model.disable_memory():
        assert perplexity(model, windows) != pytest.approx(memory, rel=1e-6)  # the baseline reads segments alone
    with pytest.raises(ValueError, match="empty"):
        corpus_nll(model, [])
