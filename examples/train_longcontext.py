"""Fine-tune a memory adapter on procedurally generated passkey / needle data with a curriculum over length, then
report accuracy at lengths never trained on (issue 16).

Each training sample is a suite task (`hmt_adapters.evaluation.tasks`, e.g. `passkey` or `niah_single`) of
`n_segments * segment_length` tokens with the answer appended; only the answer tokens carry a loss. The curriculum
moves to the next segment count once exact accuracy on a fixed batch reaches `--advance-at` (every other batch
revisits an earlier length, as `hmt_adapters.tasks.recall.train_recall` does). Exact accuracy is teacher-forced
argmax over the answer tokens, which equals greedy generation's exact match; evaluation streams the prompt with
`MemoryModel.step`, so memory use is flat in the length.

    # seconds-minutes on CPU: a tiny Llama trained from scratch (byte-level BPE trained on the filler), HMT
    python examples/train_longcontext.py --model tiny --levels 2 4 8 16 --eval-segments 32 128 512 --output runs/lc-tiny
    # SmolLM2-135M + LoRA, the acceptance run (GPU): train to 16 segments of 256, test to 512 segments (131k tokens)
    python examples/train_longcontext.py --model smollm2 --lora --haystack essays --segment-length 256 \
        --levels 2 4 8 16 --max-steps 3000 --eval-segments 16 32 128 512 --output runs/lc-smollm2
    python benchmarks/longcontext.py --adapters hmt=runs/lc-smollm2/adapter --tasks passkey niah_single \
        --lengths 4k 8k 16k 32k 128k 1M --samples 20

Writes the adapter to `<output>/adapter` and `<output>/report.json` (curriculum history, accuracy per length).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

import hmt_adapters as ha
from hmt_adapters.evaluation import TASKS, tasks
from hmt_adapters.evaluation.haystack import haystack_text
from hmt_adapters.training import add_lora

IGNORE = -100


def tiny_backbone(haystack: str, seed: int) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A 4-layer width-128 Llama from scratch and a byte-level BPE (vocabulary 512) trained on the haystack and the
    task templates (short prompts, so that short curriculum levels fit)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    templates = [tasks.PASSKEY_HEAD, tasks.RULER_NIAH_HEAD, tasks.RULER_NEEDLE, "What is the pass key? The pass key is",
                 "The special magic number for mentioned in the provided text is", " ".join(tasks.ADJECTIVES + tasks.NOUNS)]
    tok.train_from_iterator([haystack_text(haystack)[:200_000]] + templates * 50, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config), tokenizer


def batch(task: str, tokenizer, length: int, size: int, seed: int, haystack: str) -> dict[str, torch.Tensor]:
    """`size` samples of `length` prompt tokens with the answer appended; labels only on the answer tokens."""
    rows, labels = [], []
    for i in range(size):
        sample = TASKS[task](tokenizer, length, seed=seed * 100_003 + i, haystack=haystack)
        answer = tokenizer(" " + sample.answers[0], add_special_tokens=False)["input_ids"]
        rows.append(sample.input_ids + answer)
        labels.append([IGNORE] * len(sample.input_ids) + answer)
    return {"input_ids": torch.tensor(rows), "labels": torch.tensor(labels)}


@torch.no_grad()
def exact_accuracy(model: ha.MemoryModel, data: dict[str, torch.Tensor], chunk: int) -> float:
    """Teacher-forced exact match of the answer tokens, the prompt streamed `chunk` tokens at a time."""
    was = model.training
    model.eval()
    ids, labels = data["input_ids"], data["labels"]
    answer_from = int((labels[0] != IGNORE).nonzero()[0])  # same prompt length in a batch
    state, logits = None, []
    for start in range(0, ids.shape[1], chunk):
        out, state = model.step(ids[:, start : start + chunk], state)
        lo, hi = max(start, answer_from - 1), min(start + chunk, ids.shape[1] - 1)
        if lo < hi:
            logits.append(out.logits[:, lo - start : hi - start])
    model.train(was)
    predicted = torch.cat(logits, dim=1).argmax(-1)
    return float((predicted == ids[:, answer_from:]).all(-1).float().mean())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", choices=["tiny", "smollm2"])
    p.add_argument("--method", default="hmt", choices=["hmt", "rmt"])
    p.add_argument("--task", default="passkey", choices=["passkey", "niah_single"])
    p.add_argument("--haystack", default="repeat", choices=["repeat", "essays", "kjv"])
    p.add_argument("--segment-length", type=int, default=64)
    p.add_argument("--levels", type=int, nargs="+", default=[2, 4, 8, 16], help="curriculum: segments per sample")
    p.add_argument("--eval-segments", type=int, nargs="+", default=[32, 128, 512], help="lengths never trained on")
    p.add_argument("--max-steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--eval-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--advance-at", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--lora", action="store_true", help="also train LoRA on a pretrained backbone")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="runs/longcontext")
    args = p.parse_args()

    random.seed(args.seed)
    if args.model == "tiny":
        base, tokenizer = tiny_backbone(args.haystack, args.seed)
        freeze = False  # trained from scratch: the backbone learns the task with the memory
    else:
        from hmt_adapters.backbones import smollm2

        base, tokenizer = smollm2()
        freeze = True
        if args.lora:
            base = add_lora(base)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    seg = args.segment_length
    if args.method == "hmt":
        model = ha.wrap_with_memory(base, "hmt", segment_length=seg, sensory_length=max(4, seg // 8),
                                    memory_window=max(args.levels + args.eval_segments), retrieval_dim=64,
                                    freeze_backbone=freeze)
    else:
        model = ha.wrap_with_memory(base, "rmt", segment_length=seg, num_memory_tokens=8, freeze_backbone=freeze)
    model.to(device).train()
    params = [q for q in model.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    rng = torch.Generator().manual_seed(args.seed)
    fixed = {n: batch(args.task, tokenizer, n * seg, args.eval_size, 10**6 + n, args.haystack) for n in args.levels}
    history, stage, passed, start = [], 0, 0, time.time()
    bar = tqdm(range(1, args.max_steps + 1), desc=f"{args.task} {args.levels[0]} segments")
    for step in bar:
        n = args.levels[stage]
        if stage and step % 2:
            n = args.levels[int(torch.randint(0, stage, (1,), generator=rng))]
        data = {k: v.to(device) for k, v in batch(args.task, tokenizer, n * seg, args.batch_size, step, args.haystack).items()}
        loss = model(**data).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % args.eval_every:
            continue
        level = args.levels[stage]
        exact = exact_accuracy(model, {k: v.to(device) for k, v in fixed[level].items()}, 32 * seg)
        history.append({"step": step, "segments": level, "loss": loss.item(), "exact": exact, "seconds": time.time() - start})
        bar.set_description(f"{args.task} {level} segments exact {exact:.2f}")
        passed = passed + 1 if exact >= args.advance_at else 0
        if stage < len(args.levels) - 1 and passed:
            stage, passed = stage + 1, 0
        elif passed == 2:
            break
    results = {}
    for n in tqdm(sorted(set(args.levels + args.eval_segments)), desc="generalisation"):
        data = batch(args.task, tokenizer, n * seg, min(args.eval_size, 8 if n > 128 else args.eval_size), 2 * 10**6 + n, args.haystack)
        results[str(n)] = {"tokens": n * seg, "exact": exact_accuracy(model, {k: v.to(device) for k, v in data.items()}, 32 * seg),
                           "trained": n <= args.levels[stage], "samples": data["input_ids"].shape[0]}
        print(f"{n:5d} segments ({n * seg:7d} tokens)  exact {results[str(n)]['exact']:.3f}"
              f"{'' if results[str(n)]['trained'] else '  (never trained)'}", flush=True)
    os.makedirs(args.output, exist_ok=True)
    model.save_pretrained(os.path.join(args.output, "adapter"))
    with open(os.path.join(args.output, "report.json"), "w") as fh:
        json.dump({"args": vars(args), "last_level_trained": args.levels[stage], "history": history,
                   "accuracy": results, "train_seconds": time.time() - start}, fh, indent=2)


if __name__ == "__main__":
    main()
