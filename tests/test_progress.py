"""Progress on a long read: `step`, `generate`'s prompt and `ask` show a bar on a terminal (tokens read, tokens/s,
time left), and nothing in a pipe, under `disable_progress()` or with transformers' progress bars off."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

import pytest
import torch
from tqdm import tqdm
from transformers.utils import logging as hf_logging

import hmt_adapters as ha
from cases import SEGMENT, wrap
from hmt_adapters.runtime.progress import MIN_SEGMENTS
from tiny import random_ids, tiny_llama, tiny_tokenizer


class Terminal(io.StringIO):
    """Standard error as a terminal sees it (tqdm draws only where `isatty()`)."""

    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def on(screen: io.StringIO) -> Iterator[io.StringIO]:
    """`screen` as standard error inside the block (set in the test's body: pytest's capture replaces it between
    a fixture's setup and the test)."""
    before, sys.stderr = sys.stderr, screen
    try:
        yield screen
    finally:
        sys.stderr = before


def test_a_long_step_shows_every_token_read_with_its_rate():
    model = wrap("hmt", "llama").eval()
    tokens = 3 * MIN_SEGMENTS * SEGMENT + 5
    with on(Terminal()) as screen, torch.no_grad():
        model.step(random_ids(2, tokens), return_logits=False)
    drawn = screen.getvalue()
    assert "Reading" in drawn and "tok/s" in drawn
    done = tqdm.format_sizeof(tokens)  # the count as the bar writes it (scaled units: 1.05M at a million)
    assert f"100%|##########| {done}/{done}" in drawn  # every column counted, the open segment's 5 tokens too


def test_a_short_read_shows_nothing():
    model = wrap("rmt", "llama").eval()
    with on(Terminal()) as screen, torch.no_grad():
        model.step(random_ids(1, (MIN_SEGMENTS - 1) * SEGMENT))
        model.generate(input_ids=random_ids(1, SEGMENT), max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert screen.getvalue() == ""


def test_generate_shows_the_prompt_read_and_ask_the_document_read():
    model = wrap("transformer_xl", "llama").eval()
    prompt = 2 * MIN_SEGMENTS * SEGMENT
    with on(Terminal()) as screen:
        model.generate(input_ids=random_ids(1, prompt), max_new_tokens=2, do_sample=False, pad_token_id=0)
    done = tqdm.format_sizeof(prompt)
    assert f"Reading the prompt: 100%|##########| {done}/{done}" in screen.getvalue()
    tok = tiny_tokenizer()
    reader = ha.wrap_with_memory(tiny_llama(len(tok)), "transformer_xl", segment_length=16, memory_size=32).eval()
    with on(Terminal()) as screen:
        ha.ask(reader, context="the cat sat on the mat. " * 60, question="Where?", tokenizer=tok, max_new_tokens=2)
    assert "Reading:" in screen.getvalue()


@pytest.mark.parametrize("switch", ["pipe", "disable_progress", "transformers"])
def test_no_bar_in_a_pipe_under_disable_progress_or_with_transformers_bars_off(switch):
    model = wrap("hmt", "llama").eval()
    ids = random_ids(1, 2 * MIN_SEGMENTS * SEGMENT)
    with on(io.StringIO() if switch == "pipe" else Terminal()) as screen, torch.no_grad():
        if switch == "disable_progress":
            with model.disable_progress():
                model.step(ids)
            assert screen.getvalue() == ""
            model.step(ids)  # the block ended: shown again
            assert "Reading" in screen.getvalue()
            return
        if switch == "transformers":
            hf_logging.disable_progress_bar()
            try:
                model.step(ids)
            finally:
                hf_logging.enable_progress_bar()
        else:
            model.step(ids)
    assert screen.getvalue() == ""


def test_a_padded_batch_counts_each_column_once():
    """Rows that split into closed and open segments at different columns read some columns twice (the closed part,
    then the open part shifted): the bar ends at the chunk's width, not past it."""
    model = wrap("hmt", "llama").eval()
    width = 2 * MIN_SEGMENTS * SEGMENT
    ids = random_ids(2, width)
    mask = torch.ones_like(ids)
    mask[1, : SEGMENT + 1] = 0  # row 1 closes one segment fewer and leaves SEGMENT - 1 tokens open
    with on(Terminal()) as screen, torch.no_grad():
        model.step(ids, attention_mask=mask, return_logits=False)
    done = tqdm.format_sizeof(width)
    assert screen.getvalue().rstrip().endswith("tok/s]") and f"100%|##########| {done}/{done}" in screen.getvalue()
