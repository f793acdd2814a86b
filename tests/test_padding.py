"""Padded batches: any padding of a row gives the unpadded row's logits, loss, streaming output and greedy tokens."""

from __future__ import annotations

import logging

import pytest
import torch

from cases import METHOD_CASES, ROWS_CLOSE_TOGETHER, SEGMENT, token_causal, wrap
from tiny import random_ids

PADS = (1, 5, SEGMENT - 1)
WIDEST = max(PADS)
PROMPT = 2 * SEGMENT + 3  # two closed segments and an open one
NEW = SEGMENT + 2  # decoding closes one more segment
CASES = [(m, "llama") for m in METHOD_CASES] + [("hmt", "gpt2"), ("transformer_xl", "opt"), ("rmt", "mamba")]
# (left, right) padding of each padded row: left and right by 1, 5 and segment_length - 1
LAYOUTS = [(p, WIDEST - p) for p in (1, 5, WIDEST)] + [(WIDEST - p, p) for p in (1, 5, WIDEST)]
PAD_ID = 3


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(batch, mask, row, other)`: `row` padded every way of LAYOUTS, then with a gap, then `other` unpadded."""
    row, other = random_ids(1, PROMPT, seed=1), random_ids(1, PROMPT + WIDEST, seed=2)
    rows, masks = [], []
    for left, right in LAYOUTS:
        rows.append(torch.cat([torch.full((1, left), PAD_ID), row, torch.full((1, right), PAD_ID)], dim=1))
        masks.append(torch.cat([torch.zeros(1, left), torch.ones(1, PROMPT), torch.zeros(1, right)], dim=1))
    gap = SEGMENT // 2  # padding between tokens is skipped too
    rows.append(torch.cat([row[:, :gap], torch.full((1, WIDEST), PAD_ID), row[:, gap:]], dim=1))
    masks.append(torch.cat([torch.ones(1, gap), torch.zeros(1, WIDEST), torch.ones(1, PROMPT - gap)], dim=1))
    rows.append(other)
    masks.append(torch.ones_like(other))
    return torch.cat(rows), torch.cat(masks).long(), row, other


def real(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[mask.bool()]


@pytest.mark.parametrize("method,family", CASES)
def test_padded_rows_forward_like_the_unpadded_row(method, family):
    model = wrap(method, family).eval()
    batch, mask, row, other = padded_batch()
    with torch.no_grad():
        out = model(input_ids=batch, attention_mask=mask, labels=batch)  # labels at padding are ignored
        alone, alone_other = model(input_ids=row, labels=row), model(input_ids=other, labels=other)
    for i in range(len(batch) - 1):
        torch.testing.assert_close(real(out.logits[i], mask[i]), alone.logits[0], atol=1e-5, rtol=1e-4)
        assert not out.logits[i][~mask[i].bool()].any()  # padding positions hold zeros
    torch.testing.assert_close(out.logits[-1], alone_other.logits[0], atol=1e-5, rtol=1e-4)
    n, m = int(alone.num_tokens), int(alone_other.num_tokens)
    assert int(out.num_tokens) == (len(batch) - 1) * n + m
    expected = ((len(batch) - 1) * n * alone.loss + m * alone_other.loss) / out.num_tokens
    torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("method,family", [(m, f) for m, f in CASES if m not in ROWS_CLOSE_TOGETHER])
def test_padded_rows_stream_like_the_unpadded_row(method, family):
    model = wrap(method, family, **token_causal(method)).eval()  # streams cut mid-segment
    batch, mask, row, other = padded_batch()
    with torch.no_grad():
        state, parts, start = None, [], 0
        for size in (5, SEGMENT + 1, batch.shape[1] - 5 - SEGMENT - 1):  # rows close segments in different calls
            out, state = model.step(
                batch[:, start : start + size], state, attention_mask=mask[:, start : start + size]
            )
            parts.append(out.logits)
            start += size
        logits = torch.cat(parts, dim=1)
        alone, alone_other = model(input_ids=row).logits, model(input_ids=other).logits
        _, row_state = model.step(row)
    for i in range(len(batch) - 1):
        torch.testing.assert_close(real(logits[i], mask[i]), alone[0], atol=1e-5, rtol=1e-4)
        pending = state.pending_ids[i][state.pending_mask[i].bool()]
        assert torch.equal(pending, row_state.pending_ids[0])  # each row keeps its own unfinished segment
        for name, tensor in row_state.tensors.items():
            torch.testing.assert_close(state.tensors[name][i], tensor[0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(logits[-1], alone_other[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("method,family", CASES)
def test_padded_rows_generate_the_unpadded_rows_tokens(method, family):
    model = wrap(method, family).eval()
    batch, mask, row, other = padded_batch()
    greedy = dict(do_sample=False, pad_token_id=0, max_new_tokens=NEW, min_new_tokens=NEW)
    out = model.generate(input_ids=batch, attention_mask=mask, **greedy)[:, batch.shape[1] :]
    alone = model.generate(input_ids=row, **greedy)[0, PROMPT:]
    alone_other = model.generate(input_ids=other, **greedy)[0, other.shape[1] :]
    for i in range(len(batch) - 1):
        assert torch.equal(out[i], alone), f"row {i} padded {LAYOUTS[i] if i < len(LAYOUTS) else 'in the middle'}"
    assert torch.equal(out[-1], alone_other)


def test_generating_from_a_right_padded_batch_does_not_advise_left_padding():
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    generate_logger = logging.getLogger("transformers.generation.utils")
    generate_logger.addHandler(handler)
    try:
        batch, mask, _, _ = padded_batch()
        wrap("rmt", "llama").eval().generate(input_ids=batch, attention_mask=mask, pad_token_id=0, max_new_tokens=2)
        wrap("rmt", "llama").backbone.generate(input_ids=batch, attention_mask=mask, pad_token_id=0, max_new_tokens=1)
    finally:
        generate_logger.removeHandler(handler)
    # the bare backbone is still told (its right-padded rows do go wrong); the memory model's rows do not
    assert sum("right-padding was detected" in r for r in records) == 1


@pytest.mark.parametrize("return_logits", [True, False])
def test_a_state_from_padded_steps_continues_each_row_in_generate(return_logits):
    model = wrap("hmt", "llama").eval()
    batch, mask, row, _ = padded_batch()
    greedy = dict(do_sample=False, pad_token_id=0, max_new_tokens=NEW, min_new_tokens=NEW)
    question = random_ids(len(batch), 3, seed=7)
    with torch.no_grad():  # rows end with different pending tokens; without logits the LM head never runs
        out, state = model.step(batch, attention_mask=mask, return_logits=return_logits)
    assert (out.logits is None) != return_logits
    out = model.generate(input_ids=question, memory_state=state, **greedy)[:, 3:]
    for i in (0, 3, len(batch) - 1):
        source = batch[i : i + 1][:, mask[i].bool()]
        whole = model.generate(input_ids=torch.cat([source, question[i : i + 1]], dim=1), **greedy)
        assert torch.equal(out[i], whole[0, source.shape[1] + 3 :])


def test_padded_rows_give_the_unpadded_rows_gradients():
    model = wrap("hmt", "llama")
    batch, mask, row, _ = padded_batch()
    model(input_ids=batch[:1], attention_mask=mask[:1], labels=batch[:1]).loss.backward()
    padded = {name: p.grad.clone() for name, p in model.memory.named_parameters()}
    model.zero_grad()
    model(input_ids=row, labels=row).loss.backward()
    for name, p in model.memory.named_parameters():
        torch.testing.assert_close(padded[name], p.grad, atol=1e-6, rtol=1e-5)
