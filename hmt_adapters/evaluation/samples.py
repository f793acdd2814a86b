"""A long-context sample of an exact token length: instruction, haystack filler with inserts (needles, facts) at
chosen depths, and a question at the end. Every insert records its token position."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from .haystack import Haystack


@dataclass
class Insert:
    """A sentence placed in the haystack: its text, the depth asked for (0-1 of the filler) and where it landed."""

    text: str
    depth: float
    position: int = -1  # index of its first token in `Sample.input_ids`
    num_tokens: int = 0


@dataclass
class Sample:
    """One prompt: `input_ids` (exactly `length` tokens) whose greedy continuation should give `answers`."""

    task: str
    length: int
    input_ids: list[int]
    answers: list[str]
    query: str
    inserts: list[Insert]
    haystack: str
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What a results file keeps about the sample (everything but the token ids)."""
        out = asdict(self)
        del out["input_ids"]
        return out


def tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` as token ids, no special tokens."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def build_sample(
    tokenizer: PreTrainedTokenizerBase,
    haystack: Haystack,
    length: int,
    head: str,
    inserts: list[Insert],
    tail: str,
    rng: random.Random,
    keep_clear: int = 0,
    **fields: Any,
) -> Sample:
    """`head` + filler with `inserts` at their depths (snapped to the nearest sentence boundary, order kept) + `tail`,
    exactly `length` tokens; fills in each insert's `position` and `num_tokens`. With `keep_clear`, the depths span
    only the filler that ends at least `keep_clear` tokens before the prompt's end (the question included), so that
    a window of that many tokens at the end, a segment reader's last segment, holds no insert."""
    head_ids, tail_ids = tokens(tokenizer, head), tokens(tokenizer, tail)
    insert_ids = [tokens(tokenizer, " " + i.text) for i in inserts]
    filler_length = length - len(head_ids) - len(tail_ids) - sum(len(i) for i in insert_ids)
    if filler_length < len(inserts) + 1:
        raise ValueError(
            f"`length`={length} tokens is too short for this task: the instruction, question and inserts alone take "
            f"{length - filler_length} tokens; use a length of at least {length - filler_length + len(inserts) + 1}."
        )
    if any(not 0.0 <= i.depth <= 1.0 for i in inserts):
        raise ValueError(f"Insert depths must be in [0, 1], got {[i.depth for i in inserts]}.")
    usable = filler_length - max(0, keep_clear - len(tail_ids))  # filler that may precede an insert
    if keep_clear < 0 or usable < 0:
        raise ValueError(
            f"`keep_clear`={keep_clear} must be >= 0 and leave room for the inserts before it in {length} tokens "
            f"(the filler is {filler_length} tokens, the question {len(tail_ids)})."
        )
    pieces = haystack.fill(filler_length, rng)
    boundaries = [0]
    for piece in pieces:
        boundaries.append(boundaries[-1] + len(piece))
    allowed = max(b for b in range(len(boundaries)) if boundaries[b] <= usable) + 1
    cuts, previous = [], 0
    for insert in inserts:  # nearest boundary at or after the previous insert's: the order of inserts is kept
        target = insert.depth * usable
        index = min(range(previous, max(allowed, previous + 1)), key=lambda b: abs(boundaries[b] - target))
        cuts.append(index)
        previous = index
    ids, start = list(head_ids), 0
    for insert, cut, extra in zip(inserts, cuts, insert_ids):
        for piece in pieces[start:cut]:
            ids.extend(piece)
        start = cut
        insert.position, insert.num_tokens = len(ids), len(extra)
        ids.extend(extra)
    for piece in pieces[start:]:
        ids.extend(piece)
    ids.extend(tail_ids)
    if len(ids) != length:  # the construction is exact by design; this guards against a broken haystack
        raise RuntimeError(f"Built {len(ids)} tokens instead of {length}.")
    return Sample(length=length, input_ids=ids, inserts=inserts, haystack=haystack.name, **fields)
