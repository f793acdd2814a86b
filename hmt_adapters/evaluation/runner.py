"""Running the tasks: how each model reads a prompt (a `Reader`), greedy answers, scores, and book perplexity."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from ..model import MemoryModel
from .nll import perplexity_by_length, sliding_window_nll, token_nll
from .samples import Sample
from .scoring import score


@dataclass
class Reader:
    """A named way to answer a prompt: a `MemoryModel` reads all of it through its memory; a bare causal LM sees the
    last `window` tokens (its context: truncation; the memory model's window: a sliding window) or, with
    `window=None`, all of it (full attention), on prompts of at most `max_length` tokens."""

    name: str
    model: Any  # a MemoryModel or a causal LM: a torch module with `generate`
    window: int | None = None
    max_length: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.model, MemoryModel) and self.window is not None:
            raise ValueError(f"Reader '{self.name}': a MemoryModel reads the whole prompt; `window` must be None.")
        if self.window is not None and self.window < 1:
            raise ValueError(f"Reader '{self.name}': `window` must be >= 1 or None, got {self.window}.")

    def fits(self, length: int) -> bool:
        return self.max_length is None or length <= self.max_length

    @torch.no_grad()
    def generate(self, ids: Sequence[int], max_new_tokens: int, pad_token_id: int) -> list[int]:
        """Greedy continuation of `ids` (`max_new_tokens` tokens)."""
        if not self.fits(len(ids)):
            raise ValueError(
                f"Reader '{self.name}' runs on prompts of at most {self.max_length} tokens, got {len(ids)}."
            )
        kept = list(ids)[-self.window :] if self.window is not None else list(ids)
        return greedy(self.model, kept, max_new_tokens, pad_token_id)


def greedy(model: Any, ids: Sequence[int], max_new_tokens: int, pad_token_id: int, **kwargs: Any) -> list[int]:
    """The `max_new_tokens` tokens `model.generate` continues `ids` (one row) with, greedily; `kwargs` (e.g. a
    memory model's `memory_state`) go to `generate`."""
    prompt = torch.tensor([list(ids)], device=next(model.parameters()).device)
    out = model.generate(
        input_ids=prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        pad_token_id=pad_token_id,
        **kwargs,
    )
    return out[0, prompt.shape[1] :].tolist()


def answer_rows(
    readers: Sequence[Reader], samples: Sequence[Sample], tokenizer: PreTrainedTokenizerBase, progress: bool = True
) -> list[dict[str, Any]]:
    """One row per (reader, sample): the sample's record, the prediction, its score and the seconds it took; a reader
    whose `max_length` a sample exceeds gets a row with `score: None` and the reason."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = []
    bar = tqdm(total=len(readers) * len(samples), desc="long-context", disable=not progress)
    for sample in samples:
        for reader in readers:
            bar.set_description(f"{sample.task} {sample.length} {reader.name}")
            row = {"reader": reader.name, **sample.record()}
            if not reader.fits(sample.length):
                rows.append({**row, "score": None, "skipped": f"longer than {reader.max_length} tokens"})
                bar.update()
                continue
            start = time.perf_counter()
            new = reader.generate(sample.input_ids, sample.extra["max_new_tokens"], pad)
            prediction = str(tokenizer.decode(new, skip_special_tokens=True))
            rows.append(
                {
                    **row,
                    "prediction": prediction,
                    "score": score(sample.extra["metric"], prediction, sample.answers),
                    "seconds": time.perf_counter() - start,
                }
            )
            bar.update()
    bar.close()
    return rows


def retrieval_recall(model: torch.nn.Module, sample: Sample) -> dict[str, Any] | None:
    """Retrieval recall@k per layer at the question, for a memory model whose method traces its block choices (the
    `"infllm"` method with `model.memory.trace = {}` set before the prompt is read): per layer, whether every
    insert (needle) of `sample` that holds an answer (every insert if none does) was readable by the call that read
    the prompt's last token: in its local window or
    sinks, or in a retrieved block. None for models that trace nothing. It tells whether a failure is the scorer's
    (the needle's block not retrieved) or the reader's (retrieved, answered wrong)."""
    method = getattr(model, "memory", None)
    trace = getattr(method, "trace", None)
    if method is None or not trace:
        return None
    # the needles that hold an answer (a multi-key prompt's distractors need not be read); all of them otherwise
    holding = [i for i in sample.inserts if any(answer in i.text for answer in sample.answers)] or sample.inserts
    spans = [(i.position, i.position + i.num_tokens) for i in holding]
    found, blocks = {}, None
    for layer, calls in sorted(trace.items()):
        call = next((c for c in calls if c["end"] == sample.length), None)
        if call is None:
            continue
        blocks = call["blocks"]
        found[str(layer)] = all(method.span_retrieved(call, start, end) for start, end in spans)
    return {"per_layer": found, "layers_found": sum(found.values()), "layers": len(found), "blocks": blocks}


def accuracy_table(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """{task: {reader: {length: {"accuracy": mean score, "samples": n}}}} over the rows that ran."""
    scores: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row in rows:
        if row["score"] is not None:
            scores[row["task"]][row["reader"]][str(row["length"])].append(row["score"])
    return {
        task: {
            reader: {length: {"accuracy": sum(v) / len(v), "samples": len(v)} for length, v in by_length.items()}
            for reader, by_length in by_reader.items()
        }
        for task, by_reader in scores.items()
    }


@torch.no_grad()
def book_nll(reader: Reader, ids: torch.Tensor, stride: int | None = None) -> torch.Tensor:
    """Next-token NLL `[T - 1]` of a document as `reader` sees it: through memory (streamed segment by segment), a
    sliding window of `reader.window` tokens (windows end every `stride`, default half the window), or full
    attention."""
    if not reader.fits(ids.numel()):
        raise ValueError(f"Reader '{reader.name}' runs on at most {reader.max_length} tokens, got {ids.numel()}.")
    if isinstance(reader.model, MemoryModel):
        return token_nll(reader.model, ids)
    window = reader.window or ids.numel()
    return sliding_window_nll(reader.model, ids, window, stride or max(1, window // 2))


def book_perplexity(
    reader: Reader, documents: Sequence[torch.Tensor], lengths: Sequence[int], stride: int | None = None
) -> dict[str, dict[str, float]]:
    """Perplexity against position (see `perplexity_by_length`), per-token NLL pooled over `documents` (cut to the
    shortest)."""
    nll = [book_nll(reader, d, stride) for d in documents]
    shortest = min(n.numel() for n in nll)
    return perplexity_by_length(torch.stack([n[:shortest] for n in nll]).mean(0), lengths)
