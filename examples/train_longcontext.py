"""Fine-tune a memory adapter on procedurally generated passkey / needle data with a curriculum over length, then
report accuracy at lengths never trained on.

Each training sample is a suite task (`hmt_adapters.evaluation.tasks`, e.g. `passkey` or `niah_single`) of exactly
`n_segments * segment_length` tokens, the question and its answer ending inside the last segment; only the answer
tokens carry a loss, read against `no_information_nll` (1.90 nats per token for the passkey: the format learned, the
key not). With a pretrained backbone a first stage of one segment (needle, question and answer in one window) checks
the layout and the masking: the backbone passes it at once (`--sanity-stage`). The curriculum moves to the next segment
count once exact accuracy on a fixed batch reaches `--advance-at` (every other batch revisits an earlier length, as
`hmt_adapters.tasks.recall.train_recall` does). With a pretrained backbone the optimizer follows the RMT/ARMT
fine-tuning scripts: a linear warm-up over 10% of the steps, gradients clipped at 1.0, and `--batch-size` samples per
step, accumulated over micro-batches of at most `--batch-tokens` tokens. Exact accuracy is teacher-forced argmax over
the answer tokens, which equals greedy generation's exact match; evaluation streams the prompt with `MemoryModel.step`,
so memory use is flat in the length. Each evaluated length has `--eval-samples` samples whose needles sit at depths
evenly spread from the start (0) to the end (1) of the haystack.

`--method` is any registered method; the recipe sets a few of its options for the segment length (`recipe_options`)
and `--method-option key=value` (repeatable) sets any config field of the method.

    # CPU, one thread: a 2-layer width-128 Llama trained from scratch with RMT on a curriculum to 16 segments of 64
    # tokens (3000 steps: 28 minutes here, where it reached 4 segments), then passkey at 2 to 16384 segments
    # (1M tokens, 6 minutes), 8 needle depths per length
    python examples/train_longcontext.py --threads 1 --output runs/lc-tiny-rmt
    # the same with HMT (or any method: --method melodi, --method transformer_xl --method-option detach_memory=False)
    python examples/train_longcontext.py --threads 1 --method hmt --output runs/lc-tiny-hmt
    # SmolLM2-135M + LoRA, the acceptance run (GPU): train to 16 segments of 256, test to 512 segments (131k tokens)
    python examples/train_longcontext.py --model smollm2 --lora --method hmt --haystack essays --segment-length 256 \
        --levels 2 4 8 16 --max-steps 3000 --eval-segments 16 32 128 512 --output runs/lc-smollm2
    python benchmarks/longcontext.py --adapters hmt=runs/lc-smollm2/adapter --tasks passkey niah_single \
        --lengths 4k 8k 16k 32k 128k 1M --samples 20

Writes the adapter to `<output>/adapter` once training ends (for `--model tiny` also the trained backbone and its
tokenizer to `<output>/backbone`; `--init-from <output>` continues from them) and `<output>/report.json`
(provenance, arguments, curriculum history, accuracy per length) after every evaluation, so a cut-off run keeps what
it measured, with the learning curves of that history in `<output>/curves.png`. `--resume` continues a cut-off
run from its last checkpoint, or, when its training ended, evaluates only what its report lacks.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

import hmt_adapters as ha
from hmt_adapters.cli import parse_options
from hmt_adapters.compat import cache_kwargs, output_cache
from hmt_adapters.evaluation import TASKS, tasks
from hmt_adapters.evaluation.haystack import haystack_text
from hmt_adapters.runtime import segment_spans
from hmt_adapters.training import add_lora

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from common import provenance, pyplot, train_bpe  # noqa: E402  (the run record, plots and tokenizer of the lab)

IGNORE = -100


def tiny_backbone(
    haystack: str, seed: int, layers: int = 2, width: int = 128
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A `layers`-layer Llama of width `width` from scratch and a byte-level BPE (vocabulary 512) trained on the
    haystack and the task templates (short prompts, so that short curriculum levels fit)."""
    templates = [
        tasks.PASSKEY_HEAD,
        tasks.RULER_NIAH_HEAD,
        tasks.RULER_NEEDLE,
        "What is the pass key? The pass key is",
        "The special magic number for mentioned in the provided text is",
        " ".join(tasks.ADJECTIVES + tasks.NOUNS),
    ]
    tokenizer = train_bpe([haystack_text(haystack)[:200_000]] + templates * 50, 512)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config), tokenizer


def recipe_options(method: str, segment_length: int, max_segments: int) -> dict[str, Any]:
    """The recipe's settings of `method` for this segment length and longest run (what `--method-option` overrides):
    HMT keeps every segment of the longest run in its retrieval window, RMT uses 8 memory tokens."""
    if method == "hmt":
        return {"sensory_length": max(4, segment_length // 8), "memory_window": max_segments, "retrieval_dim": 64}
    if method == "rmt":
        return {"num_memory_tokens": 8}
    return {}


def parse_task_options(task: str, pairs: list[str]) -> dict[str, Any]:
    """`--task-option key=value` strings as keywords of `task`'s generator (`hmt_adapters.evaluation.tasks`), e.g.
    `updates=6 keep_clear=128` for `passkey_update` (six statements, none in the last 128 tokens); a keyword the
    generator does not take is an error naming those it does."""
    options = parse_options(pairs, "--task-option")
    taken = [
        name
        for name, p in inspect.signature(TASKS[task]).parameters.items()
        if p.kind == p.KEYWORD_ONLY and name not in ("seed", "depth", "haystack")  # the recipe sets these
    ]
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise ValueError(f"--task-option {unknown} is not a keyword of --task {task}; it takes {taken}.")
    return options


def parse_method_options(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings as keyword arguments; values are Python literals (`8`, `0.5`, `False`, `[1, 2]`) or else
    kept as strings (the `hmt-adapters` command's `--option`)."""
    return parse_options(pairs, "--method-option")


def build_model(
    base: torch.nn.Module,
    method: str,
    segment_length: int,
    max_segments: int,
    options: dict[str, Any] | None = None,
    freeze_backbone: bool = False,
) -> ha.MemoryModel:
    """`base` wrapped with any registered `method`: the recipe's settings for it, updated by `options`."""
    if method not in ha.available_methods():
        raise ValueError(f"Unknown --method {method!r}; choose one of {ha.available_methods()}.")
    options = dict(options or {})
    if "segment_length" in options:
        raise ValueError("Set the segment length with --segment-length, not --method-option segment_length=...")
    kwargs = {**recipe_options(method, segment_length, max_segments), **options}
    return ha.wrap_with_memory(base, method, segment_length=segment_length, freeze_backbone=freeze_backbone, **kwargs)


# Samples a training-free reader evaluates at once: `"infllm"` held ~0.4 GB per 1,024-token prompt at batch 50
# (killed at 19 GB of this machine's 24, 2026-12-05) and 3.2 GB in all at batch 5; most of it was the logits of the
# pending tokens `step` re-read (since 2026-12-06 not recomputed: batch 10 of 1,024 tokens in chunks of 128 peaks at
# 3.2 GB, was 5.0)
READER_GROUP = 5


# `--reader-baseline` name of the backbone reading the whole prompt in one window (no memory method)
FULL_ATTENTION = "full_attention"


class FullAttention(torch.nn.Module):
    """A backbone reading the whole prompt in one window, as `MemoryModel.step` streams it (its KV cache is the state):
    what the same prompts give when everything is in view, the level a reader within the trained context should
    reach (docs/trained_memory.md: `"infllm"` at 256-512 tokens answers exactly as this does)."""

    memory_config = None

    def __init__(self, backbone: torch.nn.Module):
        super().__init__()
        self.backbone = backbone

    def step(self, input_ids: torch.Tensor, state: Any = None) -> tuple[Any, Any]:
        out = self.backbone(input_ids=input_ids, use_cache=True, **cache_kwargs(state))  # the release's cache name
        return out, output_cache(out)

    @contextlib.contextmanager
    def disable_progress(self) -> Iterator[None]:
        yield  # one forward per chunk: nothing to show


def reader_baseline(method: str) -> ha.MemoryModel | FullAttention:
    """`method` at its defaults (or `FULL_ATTENTION`: no memory, one window) on a fresh copy of the pretrained
    SmolLM2 as it loads (no LoRA, nothing trained): what a user reads the same prompts with without training."""
    from hmt_adapters.backbones import smollm2

    if method == FULL_ATTENTION:
        return FullAttention(smollm2()[0]).eval()
    return ha.wrap_with_memory(smollm2()[0], method).eval()


def load_for_training(base: torch.nn.Module, adapter: str, freeze_backbone: bool) -> ha.MemoryModel:
    """A saved adapter on `base`, ready to train on: memory and LoRA (peft) weights trainable, the backbone's own
    weights trainable unless `freeze_backbone`."""
    model = ha.MemoryModel.from_pretrained(base, adapter, is_trainable=True)  # memory + peft weights trainable
    if not freeze_backbone:  # a tiny backbone trained from scratch trains on
        model.backbone.requires_grad_(True)
    return model


def last_checkpoint(folder: str) -> dict[str, Any] | None:
    """The curriculum position of the last checkpoint in `folder` (None: no run to continue). A kill between the two
    renames of a checkpoint's swap leaves the previous one as `<folder>.old`: it is the last whole one."""
    for candidate in (folder, folder + ".old"):
        if os.path.isfile(os.path.join(candidate, "progress.json")):
            if candidate != folder:
                os.rename(candidate, folder)
            with open(os.path.join(folder, "progress.json")) as fh:
                return json.load(fh)
    return None


def finished_run(folder: str, max_steps: int) -> dict[str, Any] | None:
    """The report of the run in `folder` if its training ended for good (its curriculum passed, or it ran `max_steps`
    steps; its final adapter saved): `--resume` then trains no further and evaluates only what the report lacks (a
    length, memory disabled, a reader) with the final adapter. A `--max-minutes` stop, or fewer steps than a resumed
    run's `--max-steps` allows, continues training from the checkpoint."""
    path = os.path.join(folder, "report.json")
    if not os.path.isfile(path) or not os.path.isdir(os.path.join(folder, "adapter")):
        return None
    with open(path) as fh:
        report = json.load(fh)
    if "steps" not in report or report.get("time_limit_reached"):
        return None
    passed = report["steps"] < report["args"]["max_steps"]  # it stopped before its own step limit: all stages passed
    return report if passed or report["steps"] >= max_steps else None


def alone_view(data: dict[str, torch.Tensor], segment_length: int) -> dict[str, torch.Tensor]:
    """What a model with memory disabled answers from: the prompts' last segment, where the layout puts question and
    answer (each segment is read alone, so the earlier ones change nothing and need not be read); the whole prompts
    where an answer token lies before it."""
    start, _ = segment_spans(data["input_ids"].shape[1], segment_length)[-1]
    if bool((data["labels"][:, :start] != IGNORE).any()):
        return data
    return {k: v[:, start:] for k, v in data.items()}


def train_batch_size(batch_size: int, batch_tokens: int, length: int) -> int:
    """Samples per training batch at `length` tokens: `batch_size`, fewer when that exceeds `batch_tokens` (at
    least 1)."""
    return max(1, min(batch_size, batch_tokens // length))


def micro_batches(batch_size: int, batch_tokens: int, length: int, accumulate: bool) -> list[int]:
    """The samples of each forward pass in one optimizer step: one batch of `train_batch_size`, or with `accumulate`
    as many such micro-batches as make `batch_size` samples (the last one smaller where it does not divide)."""
    micro = train_batch_size(batch_size, batch_tokens, length)
    if not accumulate:
        return [micro]
    sizes = [micro] * (batch_size // micro)
    return sizes + ([batch_size % micro] if batch_size % micro else [])


def warmup_factor(step: int, warmup_steps: int) -> float:
    """The learning rate's share at optimizer step `step` (1-based): linear from 1/warmup_steps to 1, then 1. A
    function of the step alone, so `--resume` continues it without a scheduler state."""
    return 1.0 if warmup_steps <= 0 else min(1.0, step / warmup_steps)


def plot_curves(history: list[dict[str, Any]], no_information: float, path: str) -> None:
    """The learning curves of `history` as a PNG: exact match on the fixed batch and the stage's loss over the
    no-information loss, against the step, one colour per curriculum level."""
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for level in sorted({h["segments"] for h in history}):
        rows = [h for h in history if h["segments"] == level]
        steps = [h["step"] for h in rows]
        top.plot(steps, [h["exact"] for h in rows], "o-", ms=3, label=f"{level} segments")
        bottom.plot(steps, [h["loss"] / no_information for h in rows], "o-", ms=3)
    top.set_ylabel("exact match (fixed batch)")
    top.set_ylim(-0.05, 1.05)
    top.legend(fontsize=8)
    bottom.axhline(1.0, color="grey", lw=0.8, ls="--")
    bottom.set_ylabel(f"answer loss / {no_information:.2f}")
    bottom.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def depth_or_none(text: str) -> float | str | None:
    """`--warmup-depth`'s value: a depth, `none` (no such stage) or `auto` (0.0 for a needle task, none else)."""
    return text.lower() if text.lower() in ("none", "auto") else float(text)


def warmup_depth(task: str, asked: float | str | None) -> float | None:
    """The first stage's needle depth for `task`: `auto` is 0.0 for a needle task and no stage for a bAbI story
    (its facts have no one depth); a depth asked for a story is an error, not dropped."""
    if asked in ("none", None):
        return None
    if task not in NEEDLE_TASKS:
        if asked == "auto":
            return None
        raise ValueError(f"--warmup-depth {asked} needs a needle task ({list(NEEDLE_TASKS)}); {task} has none.")
    return 0.0 if asked == "auto" else float(asked)


def eval_depths(samples: int) -> list[float]:
    """`samples` needle depths evenly spread over the haystack, start (0) and end (1) included; 0.5 for one."""
    if samples < 1:
        raise ValueError(f"Need at least one evaluation sample, got {samples}.")
    return [0.5] if samples == 1 else [i / (samples - 1) for i in range(samples)]


# How many answers each task draws from (its generator in `hmt_adapters.evaluation.tasks`): the passkey's 5-digit
# key and the needle's 7-digit value, uniform; an updated passkey's keys 1 to 50,000 (a reader that finds the keys
# but not which is current is at ln(updates) per answer, below this); a bAbI answer is one of the six locations. A
# model that knows the format but nothing of the key scores `no_information_nll` on the answer.
KEY_SPACE = {
    "passkey": 90_000,
    "passkey_update": 50_000,
    "niah_single": 9_000_000,
    **{f"qa{k}": len(tasks.LOCATIONS) for k in (1, 2, 3)},
}
NEEDLE_TASKS = ("passkey", "niah_single")  # one needle, placed at a depth asked for


def no_information_nll(task: str, answer_tokens: float) -> float:
    """Mean NLL per answer token, in nats, of a reader that knows the answer's format and nothing of the key: every
    key equally likely, the format tokens (the leading space) certain. ln(90,000) / 6 = 1.90 for the passkey's
    ' 12345' (6 tokens); for answers of unequal length (a bAbI location is 1 or 2 tokens) `answer_tokens` is their
    mean, as the training loss is the mean over every answer token of the batch."""
    return math.log(KEY_SPACE[task]) / answer_tokens


def batch(
    task: str,
    tokenizer,
    length: int,
    size: int,
    seed: int,
    haystack: str,
    depths: list[float] | None = None,
    options: dict[str, Any] | None = None,
) -> tuple[dict[str, torch.Tensor], list[int]]:
    """`size` samples of exactly `length` tokens, the prompt then its answer, labels only on the answer tokens
    (needles at `depths`, else at random depths; `options`: the task generator's own keywords, `--task-option`);
    and each sample's evidence position in tokens: the needle's, or for a bAbI story its earliest supporting fact's
    (what the answer depends on that lies furthest back).

    The prompt is `length` minus the answer's tokens, so that with a `length` of whole segments the question and its
    answer end inside the last segment, as in the RMT reference's fine-tuning scripts (a margin for question and
    answer). Appended to a prompt of whole segments, the answer would open a segment of its own, predicted from a
    window that holds neither the needle nor the question (docs/training.md, "Long-context recipe"). Answers may
    differ in length between samples (a bAbI location of 1 or 2 tokens): each prompt then leaves room for its own."""
    if depths is not None and task not in NEEDLE_TASKS:
        raise ValueError(f"{task} places its facts at random depths; depths are for {list(NEEDLE_TASKS)}.")
    if depths is not None and len(depths) != size:
        raise ValueError(f"{len(depths)} depths given for {size} samples.")
    rows, labels, positions = [], [], []
    answer_tokens = None
    for i in range(size):
        keywords = {**(options or {}), **({} if depths is None else {"depth": depths[i]})}
        for _ in range(3):  # the answer's length, then the sample with room for it (a key of other length: again)
            if answer_tokens is None:
                probe = TASKS[task](tokenizer, length, seed=seed * 100_003 + i, haystack=haystack, **keywords)
                answer_tokens = len(tokenizer(" " + probe.answers[0], add_special_tokens=False)["input_ids"])
            prompt = length - answer_tokens
            sample = TASKS[task](tokenizer, prompt, seed=seed * 100_003 + i, haystack=haystack, **keywords)
            answer = tokenizer(" " + sample.answers[0], add_special_tokens=False)["input_ids"]
            if len(answer) == answer_tokens:
                break
            answer_tokens = len(answer)
        else:
            raise ValueError(f"{task} sample {i} (seed {seed}): no prompt leaves room for its answer in {length}.")
        rows.append(sample.input_ids + answer)
        labels.append([IGNORE] * len(sample.input_ids) + answer)
        support = sample.extra.get("supporting_facts", [0])
        positions.append(min(sample.inserts[j].position for j in support))
    return {"input_ids": torch.tensor(rows), "labels": torch.tensor(labels)}, positions


def eval_chunk(batch_size: int, segment_length: int, vocab_size: int, logits_bytes: int = 2**30) -> int:
    """Tokens per `MemoryModel.step` call when streaming a prompt for evaluation: 32 segments, fewer (at least one)
    when that chunk's float32 logits (`batch x chunk x vocab`) would exceed `logits_bytes` (SmolLM2's 49,152-entry
    vocabulary at batch 32 and 32 segments of 256 would be 52 GB)."""
    fits = logits_bytes // (4 * batch_size * segment_length * vocab_size)
    return segment_length * max(1, min(32, fits))


@torch.no_grad()
def answer_hits(
    model: ha.MemoryModel | FullAttention,
    data: dict[str, torch.Tensor],
    chunk: int,
    progress: str | None = None,
    group: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced argmax == answer per sample and answer token (`hits`, `[batch, longest answer]`), which of
    those are answer tokens (`mask`: answers may differ in length; `hits` is True where `mask` is False), and each
    sample's answer NLL in nats per token (`[batch]`); the prompt streamed `chunk` tokens at a time (a token progress
    bar titled `progress` if given), `group` samples at a time if given (the same results, less memory)."""
    if group is not None and data["input_ids"].shape[0] > group:
        parts = [
            answer_hits(model, {k: v[i : i + group] for k, v in data.items()}, chunk, progress)
            for i in range(0, data["input_ids"].shape[0], group)
        ]
        width = max(hits.shape[1] for hits, _, _ in parts)  # answers end every row: align the parts on the right

        def padded(t: torch.Tensor, value: bool) -> torch.Tensor:
            return torch.nn.functional.pad(t, (width - t.shape[1], 0), value=value)

        return (
            torch.cat([padded(hits, True) for hits, _, _ in parts]),
            torch.cat([padded(mask, False) for _, mask, _ in parts]),
            torch.cat([nll for _, _, nll in parts]),
        )
    was = model.training
    model.eval()
    ids, labels = data["input_ids"], data["labels"]
    answer = labels != IGNORE  # every answer ends the row
    earliest = int(answer.float().argmax(-1).min())
    state, logits = None, []
    bar = tqdm(total=ids.shape[1], desc=progress, unit="tok", unit_scale=True, leave=False, disable=progress is None)
    for start in range(0, ids.shape[1], chunk):
        with model.disable_progress():  # this loop's own bar counts the prompt
            out, state = model.step(ids[:, start : start + chunk], state)
        lo, hi = max(start, earliest - 1), min(start + chunk, ids.shape[1] - 1)
        if lo < hi:
            logits.append(out.logits[:, lo - start : hi - start])
        bar.update(min(chunk, ids.shape[1] - start))
    bar.close()
    model.train(was)
    logits, target, mask = torch.cat(logits, dim=1).float(), ids[:, earliest:], answer[:, earliest:]
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="none")
    nll = (nll * mask).sum(-1) / mask.sum(-1)
    return (logits.argmax(-1) == target) | ~mask, mask, nll


def answer_summary(
    hits: torch.Tensor, mask: torch.Tensor, nll: torch.Tensor, depths: list[float | None], positions: list[int]
) -> dict[str, Any]:
    """Exact match, token accuracy and answer NLL of one evaluation (`answer_hits`' outputs), with each sample's."""
    exact = hits.all(-1)
    return {
        "exact": float(exact.float().mean()),
        "correct": int(exact.sum()),
        "samples": len(positions),
        "answer_token_accuracy": float(hits[mask].float().mean()),
        "answer_nll": float(nll.mean()),
        "per_sample": [
            {"depth": d, "needle_position": p, "exact": bool(e), "answer_nll": float(x)}
            for d, p, e, x in zip(depths, positions, exact.tolist(), nll.tolist())
        ],
    }


def exact_accuracy(model: ha.MemoryModel, data: dict[str, torch.Tensor], chunk: int) -> float:
    """Share of samples whose whole answer is right."""
    return float(answer_hits(model, data, chunk)[0].all(-1).float().mean())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    p.add_argument("--layers", type=int, default=2, help="tiny model: layers")
    p.add_argument("--width", type=int, default=128, help="tiny model: hidden size")
    p.add_argument("--method", default="rmt", choices=ha.available_methods())
    p.add_argument(
        "--method-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config field of the method (repeatable), e.g. num_memory_tokens=16 or detach_memory=False",
    )
    p.add_argument("--task", default="passkey", choices=sorted(KEY_SPACE))
    p.add_argument(
        "--task-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a keyword of the task's generator (repeatable), e.g. updates=6 or keep_clear=128 for passkey_update",
    )
    p.add_argument("--haystack", default="repeat", choices=["repeat", "essays", "kjv"])
    p.add_argument("--segment-length", type=int, default=64)
    p.add_argument("--levels", type=int, nargs="+", default=[2, 4, 8, 16], help="curriculum: segments per sample")
    p.add_argument(
        "--eval-segments",
        type=int,
        nargs="+",
        default=[64, 256, 1024, 16384],
        help="lengths never trained on (16384 segments of 64 tokens = 1M tokens)",
    )
    p.add_argument("--eval-samples", type=int, default=8, help="samples per evaluated length (needle depths 0 to 1)")
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop training after this much wall time (then save and evaluate as after --max-steps)",
    )
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--batch-tokens",
        type=int,
        default=4096,
        help="at most this many tokens per training batch: longer levels take fewer samples",
    )
    p.add_argument(
        "--warmup-depth",
        type=depth_or_none,
        default="auto",
        help="a first stage at the first level with every needle at this depth ('none': no such stage; 'auto', "
        "the default: 0.0 for passkey and niah_single, none for the bAbI tasks)",
    )
    p.add_argument(
        "--sanity-stage",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a first stage of one segment (needle, question and answer in one window): a pretrained backbone "
        "passes it at once, which checks the layout and the loss masking (default: on for --model smollm2)",
    )
    p.add_argument("--eval-size", type=int, default=32, help="fixed batch that decides the curriculum")
    p.add_argument(
        "--memory-disabled-baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="evaluate every length also with memory disabled (the same prompts, each segment alone)",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--warmup-steps",
        type=int,
        default=None,
        help="linear learning-rate warm-up over the first this many steps (default: 10%% of --max-steps for "
        "--model smollm2, as the RMT/ARMT fine-tuning scripts; 0 for --model tiny)",
    )
    p.add_argument(
        "--accumulate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every optimizer step sees --batch-size samples: where --batch-tokens allows fewer per forward, the "
        "gradients of several micro-batches are summed, as the anchors reach batch 32-64 (default: on for "
        "--model smollm2; off for --model tiny, whose batch shrinks at long levels instead)",
    )
    p.add_argument("--advance-at", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--lora", action="store_true", help="also train LoRA on a pretrained backbone")
    p.add_argument(
        "--reader-baseline",
        nargs="*",
        default=[],
        choices=[*ha.available_methods(), FULL_ATTENTION],
        metavar="METHOD",
        help="also evaluate every length with the untrained pretrained backbone wrapped with these methods at "
        f"their defaults (a training-free reader, e.g. infllm; {FULL_ATTENTION}: the whole prompt in one window), on "
        "the same prompts (--model smollm2)",
    )
    p.add_argument(
        "--reader-segments",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="evaluate the --reader-baseline readers only at these segment counts, each one of the evaluated "
        "lengths (default: at every evaluated length): a training-free reader of 32k tokens takes minutes a "
        "prompt on a CPU, where the trained memory's streaming is cheap",
    )
    p.add_argument(
        "--train-backbone",
        action="store_true",
        help="pretrained backbone: train all its weights too (full fine-tuning; the fine-tuned backbone is "
        "not saved: transformers refuses to serialise the GGUF-converted SmolLM2; the report keeps "
        "the accuracies)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument(
        "--init-from",
        metavar="FOLDER",
        help="continue from a previous run's --output (its adapter; for --model tiny also its backbone)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="runs/longcontext")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --output from its last evaluation (adapter, optimizer, curriculum stage, step); "
        "every evaluation saves them there, so a killed run loses at most --eval-every steps",
    )
    return p.parse_args(argv)


def check_reader_segments(args: argparse.Namespace) -> None:
    """`--reader-segments` names lengths that are evaluated, and only with `--reader-baseline`."""
    if args.reader_segments is None:
        return
    if not args.reader_baseline:
        raise ValueError("--reader-segments chooses where the --reader-baseline readers run; name one with it.")
    evaluated = sorted(set(args.levels + args.eval_segments))
    if not set(args.reader_segments) <= set(evaluated):
        raise ValueError(
            f"--reader-segments {args.reader_segments}: each must be an evaluated length, one of {evaluated} "
            "(--levels and --eval-segments)."
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    options = parse_method_options(args.method_option)
    task_options = parse_task_options(args.task, args.task_option)
    check_reader_segments(args)
    if args.reader_baseline and args.model == "tiny":
        raise ValueError("--reader-baseline reads with the pretrained backbone; --model tiny is trained from scratch.")
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    checkpoint = os.path.join(args.output, "checkpoint")
    done = finished_run(args.output, args.max_steps) if args.resume else None
    resumed = last_checkpoint(checkpoint) if args.resume and done is None else None
    previous = args.output if done is not None else checkpoint if resumed is not None else args.init_from
    if args.model == "tiny" and previous:  # a previous tiny run's trained backbone and tokenizer
        base = AutoModelForCausalLM.from_pretrained(os.path.join(previous, "backbone"))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(os.path.join(previous, "backbone"))
        freeze = False
    elif args.model == "tiny":
        base, tokenizer = tiny_backbone(args.haystack, args.seed, args.layers, args.width)
        freeze = False  # trained from scratch: the backbone learns the task with the memory
    else:
        from hmt_adapters.backbones import smollm2

        base, tokenizer = smollm2()
        freeze = not args.train_backbone
        if args.lora:
            base = add_lora(base)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seg = args.segment_length
    longest = max(args.levels + args.eval_segments)
    if done is not None:  # the final adapter of a run whose training ended
        model = load_for_training(base, os.path.join(args.output, "adapter"), freeze)
    elif resumed is not None:  # the last evaluation's adapter (memory and LoRA weights), trainable again
        model = load_for_training(base, os.path.join(checkpoint, "adapter"), freeze)
    elif args.init_from:  # the saved adapter (its config: method and options), everything trainable again
        model = load_for_training(base, os.path.join(args.init_from, "adapter"), freeze)
        if model.memory_config.segment_length != seg:
            raise ValueError(
                f"--init-from {args.init_from} has segment_length {model.memory_config.segment_length}; "
                f"pass --segment-length {model.memory_config.segment_length}, not {seg}."
            )
    else:
        model = build_model(base, args.method, seg, longest, options, freeze)
    model.to(device).train()
    vocab = model.backbone.get_output_embeddings().weight.shape[0]
    os.makedirs(args.output, exist_ok=True)
    report: dict[str, Any] = {
        "provenance": provenance(),
        "args": vars(args),
        "method_options": {**recipe_options(args.method, seg, longest), **options},
        "memory_config": model.memory_config.to_dict(),
        "history": [],
        "accuracy": {},
    }

    def save() -> None:
        with open(os.path.join(args.output, "report.json"), "w") as fh:
            json.dump(report, fh, indent=2)

    params = [q for q in model.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    if resumed is not None:
        optimizer.load_state_dict(torch.load(os.path.join(checkpoint, "optimizer.pt"), weights_only=True))
        report["history"] = resumed["history"]
    if done is not None:  # what it trained and evaluated is kept
        kept = ("history", "accuracy", "last_level_trained", "steps", "train_seconds")
        report.update({key: done[key] for key in kept if key in done})
    on = lambda data: {k: v.to(device) for k, v in data.items()}  # noqa: E731
    stages = [(n, None) for n in args.levels]
    first_depth = warmup_depth(args.task, args.warmup_depth)
    if first_depth is not None:  # first the needle at one depth (a fixed position, as in the recall task)
        stages.insert(0, (args.levels[0], first_depth))
    sanity = args.model != "tiny" if args.sanity_stage is None else args.sanity_stage
    accumulate = args.model != "tiny" if args.accumulate is None else args.accumulate
    if args.warmup_steps is None:
        args.warmup_steps = 0 if args.model == "tiny" else args.max_steps // 10
    if sanity:  # all in one window: a pretrained backbone answers from step 0
        try:
            batch(args.task, tokenizer, seg, 1, 0, args.haystack, options=task_options)
        except ValueError as error:
            raise ValueError(
                f"The sanity stage reads one segment of --segment-length {seg} tokens, too short for --task "
                f"{args.task}: {error} Use a longer --segment-length or --no-sanity-stage."
            ) from error
        stages.insert(0, (1, None))
    fixed = {
        (n, d): batch(
            args.task,
            tokenizer,
            n * seg,
            args.eval_size,
            10**6 + n,
            args.haystack,
            None if d is None else [d] * args.eval_size,
            task_options,
        )[0]
        for n, d in stages
    }
    answer_tokens = float((next(iter(fixed.values()))["labels"] != IGNORE).sum(-1).float().mean())
    report["no_information_nll"] = no_information_nll(args.task, answer_tokens)  # what every loss is read against
    history, stage, passed, start, steps_run = report["history"], 0, 0, time.time(), 0
    first = 1
    if resumed is not None:
        stage, passed, first = resumed["stage"], resumed["passed"], resumed["step"] + 1
        steps_run = resumed["step"]
    if done is not None:  # no training: straight to what the evaluation lacks
        first = args.max_steps + 1

    def save_checkpoint(step: int) -> None:
        """The adapter, optimizer and curriculum position after `step`, written whole or not at all."""
        staging = checkpoint + ".tmp"
        model.save_pretrained(os.path.join(staging, "adapter"))
        if not freeze and args.model == "tiny":  # trained with the memory: kept beside it
            model.backbone.save_pretrained(os.path.join(staging, "backbone"))
            tokenizer.save_pretrained(os.path.join(staging, "backbone"))
        torch.save(optimizer.state_dict(), os.path.join(staging, "optimizer.pt"))
        with open(os.path.join(staging, "progress.json"), "w") as fh:
            json.dump({"step": step, "stage": stage, "passed": passed, "history": history}, fh)
        if os.path.isdir(checkpoint):
            os.rename(checkpoint, checkpoint + ".old")
        os.rename(staging, checkpoint)
        if os.path.isdir(checkpoint + ".old"):
            shutil.rmtree(checkpoint + ".old")

    bar = tqdm(range(first, args.max_steps + 1), desc=f"{args.task} {args.levels[0]} segments")
    stage_loss = float("nan")
    for step in bar:
        n, depth = stages[stage]
        earliest = 1 if sanity else 0  # the one-segment sanity stage is a check, not a length to keep training
        revisit = bool(stage > earliest and step % 2)
        if revisit:  # an earlier length (at random depths)
            pick = torch.Generator().manual_seed(args.seed * 1_000_003 + step)  # by step: the same after --resume
            n, depth = stages[int(torch.randint(earliest, stage, (1,), generator=pick))][0], None
        sizes = micro_batches(args.batch_size, args.batch_tokens, n * seg, accumulate)
        depths = None if depth is None else [depth] * sum(sizes)
        data = batch(args.task, tokenizer, n * seg, sum(sizes), step, args.haystack, depths, task_options)[0]
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for part in zip(*(value.split(sizes) for value in data.values())):
            loss = model(**on(dict(zip(data, part)))).loss * (len(part[0]) / sum(sizes))
            loss.backward()  # the mean over the step's samples (every answer has as many tokens)
            total += loss.item()
        if not revisit:
            stage_loss = total  # what the history reports: the current stage's last batch, not a revisit
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * warmup_factor(step, args.warmup_steps)
        optimizer.step()
        steps_run = step
        if args.max_minutes is not None and time.time() - start >= 60 * args.max_minutes:
            report["time_limit_reached"] = True
            break
        if step % args.eval_every:
            continue
        level, depth = stages[stage]
        exact = exact_accuracy(model, on(fixed[stages[stage]]), eval_chunk(args.eval_size, seg, vocab))
        history.append(
            {
                "step": step,
                "segments": level,
                "depth": depth,
                "loss": stage_loss,
                "loss_over_no_information": stage_loss / report["no_information_nll"],
                "exact": exact,
                "seconds": time.time() - start,
            }
        )
        save()
        plot_curves(history, report["no_information_nll"], os.path.join(args.output, "curves.png"))
        where = "" if depth is None else f" depth {depth}"
        bar.set_description(
            f"{args.task} {level} segments{where} exact {exact:.2f} loss {stage_loss:.2f} "
            f"(no information: {report['no_information_nll']:.2f})"
        )
        passed = passed + 1 if exact >= args.advance_at else 0
        if stage < len(stages) - 1 and passed:
            stage, passed = stage + 1, 0
        elif passed == 2:
            break
        save_checkpoint(step)
    bar.close()
    if done is None:
        report.update(last_level_trained=stages[stage][0], steps=steps_run, train_seconds=time.time() - start)
        model.save_pretrained(os.path.join(args.output, "adapter"))
        if not freeze and args.model == "tiny":  # the adapter holds the memory weights only; the backbone goes beside
            model.backbone.save_pretrained(os.path.join(args.output, "backbone"))
            tokenizer.save_pretrained(os.path.join(args.output, "backbone"))
    save()
    depths = eval_depths(args.eval_samples) if args.task in NEEDLE_TASKS else None
    readers = {name: reader_baseline(name) for name in args.reader_baseline}
    trained_to = report["last_level_trained"]
    for n in sorted(set(args.levels + args.eval_segments)):  # what an earlier run of a resumed one measured is kept
        begin = time.time()
        data, positions = batch(
            args.task, tokenizer, n * seg, args.eval_samples, 2 * 10**6 + n, args.haystack, depths, task_options
        )
        listed = depths or [None] * args.eval_samples
        chunk = eval_chunk(args.eval_samples, seg, vocab)
        if report["accuracy"].get(str(n), {}).get("samples") != args.eval_samples:
            hits = answer_hits(model, on(data), chunk, progress=f"eval {n} segments ({n * seg} tokens)")
            report["accuracy"][str(n)] = {
                "segments": n,
                "tokens": n * seg,
                **answer_summary(*(h.cpu() for h in hits), listed, positions),
                "trained": n <= trained_to,
                "seconds": time.time() - begin,
                "no_information_nll": report["no_information_nll"],
            }
        row = report["accuracy"][str(n)]
        if args.memory_disabled_baseline and "memory_disabled" not in row:  # the same prompts, each segment alone
            with model.disable_memory():
                hits = answer_hits(model, on(alone_view(data, seg)), chunk)
            row["memory_disabled"] = answer_summary(*(h.cpu() for h in hits), listed, positions)
        here = readers if args.reader_segments is None or n in args.reader_segments else {}
        for name, reader in here.items():  # a training-free reader of the untrained backbone, the same prompts
            if name in row.get("readers", {}):
                continue
            hits = answer_hits(reader.to(device), on(data), chunk, f"{name} {n} segments", group=READER_GROUP)
            row.setdefault("readers", {})[name] = {
                **answer_summary(*(h.cpu() for h in hits), listed, positions),
                "memory_config": None if reader.memory_config is None else reader.memory_config.to_dict(),
            }
        save()
        alone = f", memory disabled {row['memory_disabled']['correct']}" if "memory_disabled" in row else ""
        alone += "".join(f", {name} {cell['correct']}" for name, cell in row.get("readers", {}).items())
        print(
            f"{n:6d} segments ({n * seg:8d} tokens)  exact {row['correct']}/{len(listed)}{alone}"
            f"{'' if n <= trained_to else '  (never trained)'}",
            flush=True,
        )
    report["total_seconds"] = time.time() - start
    save()
    return report


if __name__ == "__main__":
    main()
