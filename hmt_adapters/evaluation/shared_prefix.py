"""Prompts that begin alike are read alike once: the memory state after their shared whole segments is kept.

Samples of one haystack share every token before their needle (docs/infllm.md, "Evaluation cost"). A memory model
reads a prompt segment by segment, and the state after n whole segments depends on those tokens alone, so a later
prompt that shares them continues from that state (`generate(memory_state=...)`) and gives the tokens it gives
from scratch (`tests/test_infllm.py`). The plan is made before any prompt runs: prompt j continues from the
earliest earlier prompt i that shares the most whole segments with it, and prompt i keeps its state at that point
while it runs (i itself started from an earlier point, or that earlier prompt would have been chosen).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from ..model import MemoryModel
from ..state import MemoryState
from .runner import greedy


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class SharedPrefixes:
    """Greedy answers to `prompts` (batch 1 each) from `model`, reading each shared beginning once.

    Run the prompts in any order with `generate(j, ...)`: a prompt whose starting state is not there yet (its
    source has not run) is read from its own beginning instead. States are dropped once every prompt that
    continues from them has run.
    """

    def __init__(self, model: MemoryModel, prompts: Sequence[Sequence[int]]):
        self.model = model
        self.prompts = [list(p) for p in prompts]
        segment = model.memory_config.segment_length
        self.source: dict[int, tuple[int, int]] = {}  # prompt j -> (prompt i, tokens) it continues from
        self.keep: dict[int, set[int]] = {j: set() for j in range(len(prompts))}  # prompt i -> points to keep
        for j, prompt in enumerate(self.prompts):
            best = (0, -1)
            for i in range(j):
                # whole segments only, and at least one token of j left to read with the question
                shared = min(common_prefix(self.prompts[i], prompt), len(prompt) - 1) // segment * segment
                if shared > best[0]:
                    best = (shared, i)
            if best[0]:
                self.source[j] = (best[1], best[0])
                self.keep[best[1]].add(best[0])
        self.users = Counter(self.source.values())
        self.states: dict[tuple[int, int], MemoryState] = {}

    @property
    def tokens_to_read(self) -> int:
        """Prompt tokens read when every prompt runs in order (against `sum(len(p))` without sharing)."""
        return sum(len(p) - self.source.get(j, (0, 0))[1] for j, p in enumerate(self.prompts))

    @torch.no_grad()
    def generate(self, j: int, max_new_tokens: int, pad_token_id: int) -> list[int]:
        """The greedy continuation of prompt `j` (`max_new_tokens` tokens)."""
        prompt, device = self.prompts[j], next(self.model.parameters()).device
        state, start = None, 0
        if j in self.source and self.source[j] in self.states:
            state, start = self.states[self.source[j]], self.source[j][1]
            self.users[self.source[j]] -= 1
            if not self.users[self.source[j]]:
                del self.states[self.source[j]]
        for point in sorted(p for p in self.keep[j] if p > start):
            ids = torch.tensor([prompt[start:point]], device=device)
            _, state = self.model.step(ids, state, return_logits=False)
            self.states[(j, point)], start = state, point
        return greedy(self.model, prompt[start:], max_new_tokens, pad_token_id, memory_state=state)
