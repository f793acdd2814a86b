"""A progress bar over a long read: `step`, `generate`'s prompt and so `ask` and the pipeline show tokens read,
tokens/s and the time left while they read a prompt of more than `MIN_SEGMENTS` segments (docs/generation.md,
"Progress").

The bar is transformers' own `tqdm` (so `transformers.utils.logging.disable_progress_bar()` and
`HF_HUB_DISABLE_PROGRESS_BARS=1` turn it off), on standard error, and only where that is a terminal (tqdm's
`disable=None`): a test, a pipe or a log file gets nothing. `MemoryModel.disable_progress()` turns it off for one
model inside a block. The segment engine advances the bar once per segment it reads (`advance`), whichever path
(streaming, generation's prefill) reads it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

from transformers.utils import logging as hf_logging

MIN_SEGMENTS = 4  # a read of fewer segments finishes before a bar would say anything

_BAR: contextvars.ContextVar[Any] = contextvars.ContextVar("hmt_adapters_progress_bar", default=None)
_QUIET: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("hmt_adapters_quiet", default=frozenset())


@contextlib.contextmanager
def reading(owner: object, tokens: int, segment_length: int, what: str = "Reading", done: int = 0) -> Iterator[None]:
    """Show a bar of `tokens` (`done` of them read before: a read resumed) while the block reads them, if they are
    at least `MIN_SEGMENTS` segments of `segment_length`, no bar is open already (an outer read counts them) and
    `owner` is not quiet."""
    if tokens < MIN_SEGMENTS * segment_length or _BAR.get() is not None or id(owner) in _QUIET.get():
        yield
        return
    bar = hf_logging.tqdm(
        total=tokens, initial=done, desc=what, unit="tok", unit_scale=True, dynamic_ncols=True, disable=None
    )
    token = _BAR.set(bar)
    try:
        yield
    finally:
        _BAR.reset(token)
        bar.close()


def advance(tokens: int) -> None:
    """`tokens` more read (a no-op outside a bar). A padded batch's rows split into closed and open segments at
    different columns read some columns twice: the bar stops at its total."""
    bar = _BAR.get()
    if bar is None:
        return
    total, done = getattr(bar, "total", None), getattr(bar, "n", None)  # transformers' bars off: an empty stand-in
    left = total - done if isinstance(total, int) and isinstance(done, int) else tokens
    bar.update(max(0, min(tokens, left)))


@contextlib.contextmanager
def marked(owners: contextvars.ContextVar[frozenset[int]], owner: object) -> Iterator[None]:
    """`owner` in the set `owners` holds inside the block (this thread / task): a per-object switch."""
    token = owners.set(owners.get() | {id(owner)})
    try:
        yield
    finally:
        owners.reset(token)


def quiet(owner: object) -> contextlib.AbstractContextManager[None]:
    """No bar for reads of `owner` inside the block (this thread / task)."""
    return marked(_QUIET, owner)
