"""Prompts that begin alike are read alike once: the memory state after their shared whole segments is kept.

Samples of one haystack share every token before their needle (docs/infllm.md, "Evaluation cost"). A memory model
reads a prompt segment by segment, and the state after n whole segments depends on those tokens alone, so a later
prompt that shares them continues from that state (`generate(memory_state=...)`) and gives the tokens it gives
from scratch (`tests/test_infllm.py`). The plan is made before any prompt runs: prompt j continues from the
earliest earlier prompt i that shares the most whole segments with it, and prompt i keeps its state at that point
while it runs (i itself started from an earlier point, or that earlier prompt would have been chosen).

A prompt too long for one sitting (a 1M-token prompt is hours of a CPU) can be read with `Checkpoints`: its state is
saved every so many tokens, and a later run continues the prompt from its last checkpoint instead of its beginning
(`MemoryState.save`/`load` continue a read exactly; docs/infllm.md, "A long read in pieces").
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

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


def fingerprint(ids: Sequence[int]) -> str:
    """A short hash of token ids: which tokens a checkpoint's state has read."""
    return hashlib.sha256(torch.tensor(list(ids), dtype=torch.int64).numpy().tobytes()).hexdigest()[:16]


@dataclass
class Progress:
    """How far a prompt's reading got and what it cost: the tokens read, and the wall and CPU seconds spent on them
    (by every run that read them, when a reading was resumed)."""

    tokens: int
    seconds: float
    cpu_seconds: float


@dataclass
class Checkpoints:
    """The state of a prompt being read, saved in `directory` every `every` tokens (a multiple of the segment
    length) as `<name>.safetensors`, and removed once the prompt is answered."""

    directory: str | os.PathLike
    every: int

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"Checkpoints: `every` must be a positive number of tokens, got {self.every}.")

    def path(self, name: str) -> Path:
        return Path(self.directory) / f"{name}.safetensors"

    def load(self, name: str, prompt: Sequence[int]) -> tuple[MemoryState, Progress] | None:
        """The saved state of prompt `name` and how far it read, or None without a checkpoint; a checkpoint of other
        tokens (the prompt changed since) is an error naming the file."""
        path = self.path(name)
        if not path.exists():
            return None
        state = MemoryState.load(path)
        mark = state.extras.get("checkpoint", {})
        tokens = int(mark.get("tokens", -1))
        if not 0 < tokens < len(prompt) or mark.get("fingerprint") != fingerprint(prompt[:tokens]):
            raise ValueError(
                f"The checkpoint {path} is not a state of this prompt's first tokens (it read {tokens} tokens of "
                "other text, or was not written by `Checkpoints`): delete it to read the prompt from its beginning."
            )
        return state, Progress(tokens, float(mark["seconds"]), float(mark["cpu_seconds"]))

    def save(self, name: str, prompt: Sequence[int], state: MemoryState, progress: Progress) -> None:
        """Write the state after the first `progress.tokens` of the prompt; the file is replaced whole (a run stopped
        while writing leaves the previous checkpoint)."""
        Path(self.directory).mkdir(parents=True, exist_ok=True)
        mark = {
            "tokens": progress.tokens,
            "fingerprint": fingerprint(prompt[: progress.tokens]),
            "seconds": progress.seconds,
            "cpu_seconds": progress.cpu_seconds,
        }
        marked = replace(state, extras={**state.extras, "checkpoint": mark})  # the same tensors, marked
        path = self.path(name)
        partial = path.with_suffix(".partial")
        marked.save(partial)
        os.replace(partial, path)

    def drop(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)


class SharedPrefixes:
    """Greedy answers to `prompts` (batch 1 each) from `model`, reading each shared beginning once.

    Run the prompts in any order with `generate(j, ...)`: a prompt whose starting state is not there yet (its
    source has not run) is read from its own beginning instead. States are dropped once every prompt that
    continues from them has run. With `checkpoints` (and one file name per prompt, `names`), prompt j's state is
    saved every `checkpoints.every` tokens and j continues from its own checkpoint when that is further than its
    source's state (`resumed[j]` then says how far it was and what it had cost).
    """

    def __init__(
        self,
        model: MemoryModel,
        prompts: Sequence[Sequence[int]],
        checkpoints: Checkpoints | None = None,
        names: Sequence[str] | None = None,
    ):
        self.model = model
        self.prompts = [list(p) for p in prompts]
        segment = model.memory_config.segment_length
        if checkpoints is not None:
            if checkpoints.every % segment:
                raise ValueError(
                    f"Checkpoints every {checkpoints.every} tokens: it must be a multiple of the segment length "
                    f"({segment}), so that each checkpoint holds whole segments."
                )
            if names is None or len(names) != len(self.prompts) or len(set(names)) != len(names):
                raise ValueError("Checkpoints need one distinct file name per prompt (`names`).")
        self.checkpoints, self.names = checkpoints, list(names or [])
        self.resumed: dict[int, Progress] = {}
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
        checkpoints, name = self.checkpoints, self.names[j] if self.names else ""
        spent = Progress(0, 0.0, 0.0)
        saved = None if checkpoints is None else checkpoints.load(name, prompt)
        if saved is not None and saved[1].tokens > start:
            (state, spent), start = saved, saved[1].tokens
            self.resumed[j] = spent
        points = {p for p in self.keep[j] if p > start}
        if checkpoints is not None:  # whole segments, and at least one token left for the question's call
            points |= set(range((start // checkpoints.every + 1) * checkpoints.every, len(prompt), checkpoints.every))
        wall, cpu = time.perf_counter(), time.process_time()
        for point in sorted(points):
            ids = torch.tensor([prompt[start:point]], device=device)
            _, state = self.model.step(ids, state, return_logits=False)
            start = point
            if point in self.keep[j]:
                self.states[(j, point)] = state
            if checkpoints is not None and point % checkpoints.every == 0:
                so_far = Progress(
                    point, spent.seconds + time.perf_counter() - wall, spent.cpu_seconds + time.process_time() - cpu
                )
                checkpoints.save(name, prompt, state, so_far)
        answer = greedy(self.model, prompt[start:], max_new_tokens, pad_token_id, memory_state=state)
        if checkpoints is not None:
            checkpoints.drop(name)
        return answer
