"""Questions about one long document in one call: the document is read into memory once, each question is answered
from that memory (docs/infllm.md, "Asking about a document").

`ask(model, context=..., question=...)` is `model.generate` on the tokens of `context + separator + question`,
except that the context's segments are read once (without the LM head) and every question continues from the state
after them, so asking k questions costs one reading of the document plus k short generations.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from .model import MemoryModel


def ask(
    model: MemoryModel,
    context: str,
    question: str | Sequence[str],
    tokenizer: Any = None,
    *,
    separator: str = "\n",
    max_new_tokens: int = 32,
    state_dir: str | os.PathLike | None = None,
    save_every: int | None = None,
    **generate_kwargs: Any,
) -> str | list[str]:
    """The answer (new text, special tokens removed, stripped) to `question`, or a list of answers to a list of
    questions, about `context`.

    `tokenizer` defaults to `model.tokenizer` (the one the adapter was loaded or saved with). The context is
    tokenized with the tokenizer's special tokens (BOS where it adds one), each `separator + question` without.
    `generate_kwargs` go to `model.generate` (greedy unless they say otherwise). The prompt is raw text: for a chat
    model, put its template's words into `context` and `question` yourself. With `state_dir`, the read survives a
    restart: the context's state is saved there every `save_every` tokens and at the end, and a call on the same
    context continues from it (the whole read done: the questions are answered at once; `MemoryModel.step`).
    """
    if not isinstance(model, MemoryModel):
        raise TypeError(
            f"`ask` reads the context through memory: `model` must be a MemoryModel "
            f"(wrap_with_memory or AutoMemoryModelForCausalLM), got {type(model).__name__}."
        )
    tokenizer = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("`ask` needs a tokenizer: pass `tokenizer=` (this model was not loaded or saved with one).")
    if not isinstance(context, str):
        raise TypeError(f"`context` must be a str, got {type(context).__name__}.")
    questions = [question] if isinstance(question, str) else list(question)
    if not questions or not all(isinstance(q, str) and q.strip() for q in questions):
        raise ValueError(f"`question` must be a non-empty str or a list of them, got {question!r}.")
    device = next(model.parameters()).device
    state = None
    context_ids = tokenizer(context, add_special_tokens=True)["input_ids"]
    if context_ids:
        with torch.no_grad():
            ids = torch.tensor([context_ids], device=device)
            _, state = model.step(ids, return_logits=False, state_dir=state_dir, save_every=save_every)
    fixed = sorted(
        {"input_ids", "attention_mask", "memory_state", "return_dict_in_generate", "num_return_sequences"}
        & set(generate_kwargs)
    )
    if fixed:
        raise ValueError(
            f"`ask` sets {fixed} itself (one greedy or sampled answer per question from the context's "
            "memory); call `model.generate(memory_state=...)` for those options."
        )
    settings = {"do_sample": False, "max_new_tokens": max_new_tokens, **generate_kwargs}
    if settings.get("pad_token_id") is None:
        settings["pad_token_id"] = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
    answers = []
    for text in questions:
        ids = torch.tensor([tokenizer(separator + text, add_special_tokens=False)["input_ids"]], device=device)
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), memory_state=state, **settings)
        answers.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip())
    return answers[0] if isinstance(question, str) else answers
