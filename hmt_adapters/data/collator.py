"""`WindowCollator`: pad windows of token ids per batch for a `MemoryModel` under the HF `Trainer`.

`DataCollatorForLanguageModeling` needs a tokenizer and masks every pad-token id in the labels, which drops the EOS
targets of models whose pad token is their EOS token; this collator masks padding *positions* instead. With
`loss_segments=k` it also keeps only the targets predicted inside each row's last k segments (the HMT reference
trains on the last segment only); the runtime then runs no LM head on the other segments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

IGNORE_INDEX = -100


@dataclass
class WindowCollator:
    """Right-pad `input_ids` (and `labels`, when rows carry them) to the longest row of the batch.

    A row's own `attention_mask` (e.g. from `tokenizer(..., padding="max_length")` in `datasets.map`) is kept: the
    positions it masks are padding, read by no segment and never a target.

    Args:
        pad_token_id: id written into padding positions (never a target: labels there are -100).
        min_length: rows with fewer tokens are an error (e.g. `segment_length`: a shorter window trains no memory).
        loss_segments: when set, each row's labels are -100 except in its last `loss_segments` segments (segments
            counted from the row's first token, a partial last one included), and on the first token of those, which
            no position inside them predicts: the loss covers exactly the predictions made inside the last k segments.
        segment_length: the model's `segment_length`; needed with `loss_segments`.
        return_logits: passed to the model when set; None (the default) lets the model decide: no `[B, T, V]` logits in
            a Trainer training step (which reads only the loss), logits in evaluation.
    """

    pad_token_id: int = 0
    min_length: int = 1
    loss_segments: int | None = None
    segment_length: int | None = None
    return_logits: bool | None = None

    def __post_init__(self) -> None:
        for name in ("loss_segments", "segment_length"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"`{name}` must be None or an integer >= 1, got {value!r}.")
        if self.loss_segments is not None and self.segment_length is None:
            raise ValueError(
                f"`loss_segments={self.loss_segments}` needs `segment_length` (the model's segment length)."
            )

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        ids = [self._row_ids(n, row) for n, row in enumerate(rows)]
        labels = [
            torch.as_tensor(row["labels"], dtype=torch.long) if "labels" in row else i for row, i in zip(rows, ids)
        ]
        masks = [self._row_mask(n, row, i) for n, (row, i) in enumerate(zip(rows, ids))]
        for n, (i, lab) in enumerate(zip(ids, labels)):
            if lab.shape != i.shape:
                raise ValueError(f"Row {n}: `labels` has {lab.numel()} entries but `input_ids` has {i.numel()}.")
        length = max(i.numel() for i in ids)
        batch_ids = torch.full((len(ids), length), self.pad_token_id, dtype=torch.long)
        batch_labels = torch.full((len(ids), length), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(ids), length), dtype=torch.long)
        for n, (i, lab, row_mask) in enumerate(zip(ids, labels, masks)):
            batch_ids[n, : i.numel()], mask[n, : i.numel()] = i, row_mask
            batch_labels[n, : i.numel()] = lab.masked_fill(row_mask == 0, IGNORE_INDEX)
            if self.loss_segments is not None:
                real = row_mask.nonzero()[:, 0]  # the model's segments count a row's real tokens only
                batch_labels[n, real[: self._first_target(real.numel())]] = IGNORE_INDEX
        batch: dict[str, Any] = {"input_ids": batch_ids, "attention_mask": mask, "labels": batch_labels}
        if self.return_logits is not None:
            batch["return_logits"] = self.return_logits
        return batch

    def _first_target(self, length: int) -> int:
        """Index of the first label a row keeps: one past the start of its last `loss_segments` segments."""
        assert self.loss_segments is not None and self.segment_length is not None  # checked in __post_init__
        segments = -(-length // self.segment_length)
        return max(0, segments - self.loss_segments) * self.segment_length + 1

    @staticmethod
    def _row_mask(n: int, row: Mapping[str, Any], ids: torch.Tensor) -> torch.Tensor:
        """The row's own `attention_mask` (rows padded by a tokenizer or `datasets.map`), else all ones.

        As in transformers, any nonzero value attends; positions it masks are padding: not read, never a target.
        """
        if "attention_mask" not in row:
            return torch.ones_like(ids)
        mask = torch.as_tensor(row["attention_mask"])
        if mask.shape != ids.shape:
            raise ValueError(
                f"Row {n}: `attention_mask` has shape {tuple(mask.shape)} but `input_ids` has {tuple(ids.shape)}."
            )
        return (mask != 0).long()

    def _row_ids(self, n: int, row: Mapping[str, Any]) -> torch.Tensor:
        if "input_ids" not in row:
            raise ValueError(
                f"Row {n} has no `input_ids` (keys: {sorted(row)}); tokenize the documents first "
                "(`hmt_adapters.data.tokenize_documents` then `make_windows`)."
            )
        ids = torch.as_tensor(row["input_ids"], dtype=torch.long)
        if ids.dim() != 1 or ids.numel() < self.min_length:
            raise ValueError(
                f"Row {n} has {ids.numel()} tokens (shape {tuple(ids.shape)}); a window needs a flat list of at least "
                f"{self.min_length} tokens (one segment)."
            )
        return ids
