"""Long-range recall: a key of digits in the first segment, noise segments, then a query for the key.

Token layout: 0 padding, 1 key marker, 2 query marker, 10-19 digits, 20.. noise. The first segment holds the key
marker and `num_digits` digits at a random offset; `gap` segments of noise follow; the last segment ends with the
query marker and the digits, and only the digits are supervised. A model that sees one segment at a time can only
guess (per digit 1/10); a memory that carries the key across `gap` segments answers it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

KEY, QUERY, FIRST_DIGIT, FIRST_NOISE = 1, 2, 10, 20


@dataclass
class RecallTask:
    """Generator and scorer of recall samples."""

    segment_length: int = 8
    num_digits: int = 4
    vocab_size: int = 64

    def __post_init__(self) -> None:
        if self.segment_length < self.num_digits + 2:
            raise ValueError(
                f"`segment_length` must be >= `num_digits` + 2 = {self.num_digits + 2} (marker, digits, one free "
                f"slot), got {self.segment_length}."
            )
        if self.vocab_size <= FIRST_NOISE:
            raise ValueError(f"`vocab_size` must be > {FIRST_NOISE} (room for noise tokens), got {self.vocab_size}.")

    def sample(self, batch_size: int, gap: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """`input_ids` and `labels` `[batch_size, (gap + 2) * segment_length]`; labels are -100 except the answer."""
        length = (gap + 2) * self.segment_length
        ids = torch.randint(FIRST_NOISE, self.vocab_size, (batch_size, length), generator=generator)
        digits = torch.randint(0, 10, (batch_size, self.num_digits), generator=generator) + FIRST_DIGIT
        offset = torch.randint(0, self.segment_length - self.num_digits - 1, (batch_size,), generator=generator)
        rows = torch.arange(batch_size)
        ids[rows, offset] = KEY
        for i in range(self.num_digits):
            ids[rows, offset + 1 + i] = digits[:, i]
        ids[:, -self.num_digits - 1] = QUERY
        ids[:, -self.num_digits :] = digits
        labels = torch.full_like(ids, -100)
        labels[:, -self.num_digits :] = digits
        return {"input_ids": ids, "labels": labels}

    @torch.no_grad()
    def accuracy(
        self, model: torch.nn.Module, gap: int, batch_size: int = 256, seed: int = 1234
    ) -> tuple[float, float]:
        """(per-digit accuracy, exact-key accuracy) of greedy answers on a fixed evaluation batch."""
        was_training = model.training
        model.eval()
        batch = self.sample(batch_size, gap, torch.Generator().manual_seed(seed))
        logits = model(input_ids=batch["input_ids"]).logits
        model.train(was_training)
        predicted = logits[:, -self.num_digits - 1 : -1].argmax(-1)
        correct = predicted == batch["input_ids"][:, -self.num_digits :]
        return correct.float().mean().item(), correct.all(-1).float().mean().item()


def train_recall(
    model: torch.nn.Module,
    task: RecallTask,
    gaps: tuple[int, ...] = (0, 1, 2, 4, 8),
    max_steps: int = 4000,
    batch_size: int = 32,
    lr: float = 1e-3,
    advance_at: float = 0.95,
    eval_every: int = 50,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Train on a curriculum of gaps: move to the next gap once exact accuracy reaches `advance_at`.

    Every other batch revisits a random earlier gap, so shorter distances are not forgotten. Stops when the last gap
    reaches `advance_at` on two evaluations in a row, or after `max_steps`; returns the evaluation history.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    history, stage, passed, start = [], 0, 0, time.time()
    model.train()
    bar = tqdm(range(1, max_steps + 1), desc=f"recall gap {gaps[0]}", leave=False)
    for step in bar:
        gap = gaps[stage]
        if stage and step % 2:
            gap = gaps[int(torch.randint(0, stage, (1,), generator=generator))]
        loss = model(**task.sample(batch_size, gap, generator)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % eval_every:
            continue
        digit, exact = task.accuracy(model, gaps[stage], batch_size=256)
        history.append(
            {
                "step": step,
                "gap": gaps[stage],
                "loss": loss.item(),
                "digit": digit,
                "exact": exact,
                "seconds": time.time() - start,
            }
        )
        bar.set_description(f"recall gap {gaps[stage]} exact {exact:.2f}")
        if log:
            log(f"step {step:5d}  gap {gaps[stage]:2d}  loss {loss.item():.3f}  exact {exact:.3f}")
        passed = passed + 1 if exact >= advance_at else 0
        if stage < len(gaps) - 1 and passed:
            stage, passed = stage + 1, 0
        elif passed == 2:
            break
    return history
