"""`generate` options with memory: beams and return sequences work per row, the rest is refused before any work."""

from __future__ import annotations

import pytest
import torch

from cases import SEGMENT, wrap
from tiny import random_ids

NEW = dict(max_new_tokens=SEGMENT + 3, min_new_tokens=SEGMENT + 3, pad_token_id=0)


def left_padded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(batch, mask, short, long)`: a short prompt left-padded next to a long one."""
    short, long = random_ids(1, SEGMENT + 3, seed=1), random_ids(1, 2 * SEGMENT + 1, seed=2)
    pad = long.shape[1] - short.shape[1]
    batch = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], dim=1), long])
    mask = torch.ones_like(batch)
    mask[0, :pad] = 0
    return batch, mask, short, long


@pytest.mark.parametrize("method", ["hmt", "transformer_xl", "melodi"])
def test_beam_search_carries_one_memory_per_beam(method):
    model = wrap(method, "llama").eval()
    batch, mask, short, long = left_padded()
    beams = dict(num_beams=3, num_return_sequences=2, do_sample=False, **NEW)
    out = model.generate(input_ids=batch, attention_mask=mask, **beams)
    uncached = model.generate(input_ids=batch, attention_mask=mask, use_cache=False, **beams)  # full re-read per step
    assert out.shape == (4, batch.shape[1] + NEW["max_new_tokens"]) and torch.equal(out, uncached)
    width = batch.shape[1]
    assert torch.equal(out[:2, width:], model.generate(input_ids=short, **beams)[:, short.shape[1] :])
    assert torch.equal(out[2:, width:], model.generate(input_ids=long, **beams)[:, long.shape[1] :])
    best = model.generate(
        input_ids=long,
        num_beams=3,
        do_sample=False,
        length_penalty=0.0,
        max_new_tokens=SEGMENT + 3,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    seq = best.sequences
    with torch.no_grad():
        logits = model(input_ids=seq[:, :-1]).logits[0, long.shape[1] - 1 :].log_softmax(-1)
    summed = logits.gather(-1, seq[0, long.shape[1] :, None]).sum()
    torch.testing.assert_close(
        best.sequences_scores[0], summed, atol=1e-4, rtol=1e-5
    )  # the beam's score is its sequence's


def test_return_sequences_with_sampling_are_independent_draws_per_row():
    model = wrap("hmt", "llama").eval()
    batch, mask, short, _ = left_padded()
    sample = dict(do_sample=True, num_return_sequences=3, **NEW)
    torch.manual_seed(0)
    a = model.generate(input_ids=batch, attention_mask=mask, **sample)
    torch.manual_seed(0)
    b = model.generate(input_ids=batch, attention_mask=mask, use_cache=False, **sample)
    assert a.shape[0] == 6 and torch.equal(a, b)
    assert len({tuple(r) for r in a[:3, batch.shape[1] :].tolist()}) > 1  # real draws, not copies
    top1 = model.generate(input_ids=batch, attention_mask=mask, do_sample=True, top_k=1, num_return_sequences=3, **NEW)
    alone = model.generate(input_ids=short, do_sample=False, **NEW)[0, short.shape[1] :]
    assert all(torch.equal(top1[i, batch.shape[1] :], alone) for i in range(3))


def test_return_sequences_continue_a_stored_memory_state():
    model = wrap("rmt", "llama").eval()
    document, question = random_ids(2, 2 * SEGMENT + 3, seed=4), random_ids(2, 3, seed=5)
    with torch.no_grad():
        _, state = model.step(document)
    out = model.generate(
        input_ids=question, memory_state=state, num_beams=2, num_return_sequences=2, do_sample=False, **NEW
    )
    whole = model.generate(
        input_ids=torch.cat([document, question], dim=1), num_beams=2, num_return_sequences=2, do_sample=False, **NEW
    )
    assert torch.equal(out[:, 3:], whole[:, document.shape[1] + 3 :])


REFUSED = [
    (dict(prompt_lookup_num_tokens=3), "prompt_lookup_num_tokens"),
    (dict(assistant_early_exit=1), "assistant_early_exit"),
    (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha"),
    (dict(dola_layers="low"), "dola_layers"),
    (dict(num_beams=4, num_beam_groups=2, diversity_penalty=1.0), "num_beam_groups"),
    (dict(num_beams=2, force_words_ids=[[5]]), "force_words_ids"),
    (dict(output_hidden_states=True, return_dict_in_generate=True), "output_hidden_states"),
    (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
    (dict(cache_implementation="static"), "cache_implementation"),
    (dict(prefill_chunk_size=8), "prefill_chunk_size"),
]


@pytest.mark.parametrize("options,name", REFUSED, ids=[name for _, name in REFUSED])
def test_unsupported_options_are_refused_before_any_work(options, name, monkeypatch):
    model = wrap("hmt", "llama").eval()
    calls = []
    monkeypatch.setattr(model.runtime, "run", lambda *a, **k: calls.append(1))
    with pytest.raises(ValueError, match=name):
        model.generate(input_ids=random_ids(1, 5), max_new_tokens=4, pad_token_id=0, **options)
    assert not calls


def test_an_assistant_model_is_refused_by_name():
    model = wrap("hmt", "llama").eval()
    with pytest.raises(ValueError, match="assistant_model"):
        model.generate(
            input_ids=random_ids(1, 5), assistant_model=wrap("hmt", "llama"), max_new_tokens=4, pad_token_id=0
        )
