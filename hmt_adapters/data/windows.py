"""Tokenize documents and cut them into training windows of `n_segments x segment_length` tokens.

Windows never cross a document boundary unless `cross_documents=True`, so the memory never carries one document
into another during training. Each window keeps the index of its document (`document`). With a `stride` shorter than
the window, windows overlap (the HMT/RMT reference's protocol: a window ends at every segment, so with last-segment
loss every segment is trained once, read after up to `n_segments - 1` segments of its own document).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any

from datasets import Dataset

logger = logging.getLogger(__name__)


def tokenize_documents(
    documents: Dataset, tokenizer: Any, *, text_column: str = "text", add_eos: bool = True, num_proc: int | None = None
) -> Dataset:
    """Add `input_ids` (one list per document, an EOS token appended) and drop the text; an empty document is an
    error."""
    if text_column not in documents.column_names:
        raise ValueError(f"The documents have no column {text_column!r}; columns: {documents.column_names}.")
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []

    def encode(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        for index, text in zip(indices, batch[text_column]):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"Document {index} is empty ({text!r}); remove it before tokenizing.")
        ids = tokenizer(batch[text_column], add_special_tokens=False)["input_ids"]
        return {"input_ids": [row + eos for row in ids]}

    return documents.map(encode, batched=True, with_indices=True, remove_columns=[text_column], num_proc=num_proc)


def _check_window_args(segment_length: int, n_segments: int, min_segments: int, stride: int) -> None:
    for name, value in (
        ("segment_length", segment_length),
        ("n_segments", n_segments),
        ("min_segments", min_segments),
        ("stride", stride),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"`{name}` must be an integer >= 1, got {value!r}.")
    if min_segments > n_segments:
        raise ValueError(f"`min_segments` must be in [1, n_segments={n_segments}], got {min_segments}.")
    if stride > segment_length * n_segments:
        raise ValueError(
            f"`stride` must be in [1, {segment_length * n_segments}] (the window length): a longer stride would skip "
            f"tokens, got {stride}."
        )


def _window_spans(length: int, window: int, stride: int) -> list[tuple[int, int]]:
    """`[start, end)` of windows ending every `stride` tokens (the last one at `length`), each up to `window` long."""
    return [(max(0, end - window), min(end, length)) for end in range(stride, length + stride, stride)]


def make_windows(
    tokenized: Dataset,
    segment_length: int,
    n_segments: int,
    *,
    min_segments: int = 1,
    stride: int | None = None,
    cross_documents: bool = False,
) -> Dataset:
    """Split each document's `input_ids` into windows of up to `n_segments * segment_length` tokens.

    Windows end every `stride` tokens (default: the window length, so they tile the document without overlap) and
    reach back at most one window length; `stride=segment_length` gives one window per segment, the reference's
    protocol. A window is kept when it holds at least `min_segments` full segments (a document's short tail, or with
    overlap its short first windows, carry too little to remember); `min_segments=n_segments` keeps only full-depth
    windows. With `cross_documents=True` the documents are concatenated first and windows are packed across boundaries
    (`document` is then the index of the window's first document).
    """
    stride = segment_length * n_segments if stride is None else stride
    _check_window_args(segment_length, n_segments, min_segments, stride)
    if "input_ids" not in tokenized.column_names:
        raise ValueError(
            f"The dataset has no `input_ids` column (columns: {tokenized.column_names}); run `tokenize_documents` "
            "first."
        )
    window, shortest = segment_length * n_segments, segment_length * min_segments

    def cut(batch: dict[str, list], indices: list[int]) -> dict[str, list]:
        docs = batch["input_ids"]
        if cross_documents:
            ends = list(itertools.accumulate(len(ids) for ids in docs))
            flat = list(itertools.chain.from_iterable(docs))
            spans = _window_spans(len(flat), window, stride)
            pieces = [(indices[bisect.bisect_right(ends, s)], flat[s:e]) for s, e in spans]
        else:
            pieces = [
                (i, ids[s:e]) for i, ids in zip(indices, docs) for s, e in _window_spans(len(ids), window, stride)
            ]
        kept = [(i, w) for i, w in pieces if len(w) >= shortest]
        return {"input_ids": [w for _, w in kept], "document": [i for i, _ in kept]}

    windows = tokenized.map(
        cut,
        batched=True,
        batch_size=None if cross_documents else 1000,
        with_indices=True,
        remove_columns=tokenized.column_names,
    )
    if len(windows) == 0:
        raise ValueError(
            f"No window of at least {min_segments} x {segment_length} tokens: every document is shorter "
            f"(longest has {max((len(r) for r in tokenized['input_ids']), default=0)} tokens)."
        )
    logger.info(
        "%d documents -> %d windows of up to %d tokens, stride %d", len(tokenized), len(windows), window, stride
    )
    return windows


@dataclass(frozen=True)
class DepthSummary:
    """How many segments the windows really hold, against the `asked` depth (BPTT depth a stage is named after)."""

    asked: int
    windows: int
    min: int
    median: float
    max: int
    shorter: int  # windows with fewer than `asked` segments

    def __str__(self) -> str:
        return (
            f"{self.windows} windows, {self.asked} segments asked, depth min/median/max {self.min}/{self.median:g}/"
            f"{self.max}, {self.shorter} ({100 * self.shorter / self.windows:.1f}%) shorter"
        )


def depth_summary(windows: Dataset, segment_length: int, n_segments: int) -> DepthSummary:
    """The depth distribution of `windows` (a window's depth: its segment count, a partial last segment included)."""
    depths = [math.ceil(len(ids) / segment_length) for ids in windows["input_ids"]]
    if not depths:
        raise ValueError("No windows to summarise.")
    return DepthSummary(
        n_segments,
        len(depths),
        min(depths),
        statistics.median(depths),
        max(depths),
        sum(d < n_segments for d in depths),
    )
