"""Training-step speed and peak memory under the HMT reference's last-segment loss, against every-token loss and
against the code before the runtime skipped unsupervised segments.

One HMT training step (forward through `--depth` segments, backward) on a randomly initialised Llama, each variant in
a fresh process:

- `every-token`: labels on every token (the package's default loss);
- `last-segment`: labels only inside the last segment (`WindowCollator(loss_segments=1)`), this code: the LM head and
  the cross-entropy run on the last segment only;
- `last-segment, previous code`: the same labels on the package as of `--previous` (default 2355dae, before the skip),
  exported with `git archive` into a temp folder that the worker puts first on `sys.path`.

    # CPU, fp32, depth 16: ~3 minutes on 2 busy cores
    nice -n 10 .venv/bin/python benchmarks/last_segment_loss.py --hidden 128 --layers 2 --heads 4 \
        --segment-length 128 --batch-size 1 --threads 1
    python benchmarks/last_segment_loss.py --device cuda --dtype bf16 --hidden 576 --layers 30 --heads 9 --kv-heads 3 \
        --vocab 49152                                                    # SmolLM2-135M's shape

Memory: peak RSS growth of the step on CPU, `torch.cuda.max_memory_allocated` growth on CUDA. Prints a table and
writes benchmarks/results/last_segment_loss[_cuda].json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from common import ROOT, in_fresh_process, write_result  # benchmarks/ is the script folder
from training_memory import MB, SWITCHES, PeakRSS, add_model_args, answered_as_worker, build_model, fastest_step

VARIANTS = ("every-token", "last-segment", "last-segment, previous code")
MODEL_ARGS = (
    "device",
    "dtype",
    "hidden",
    "layers",
    "heads",
    "kv_heads",
    "vocab",
    "segment_length",
    "batch_size",
    "depth",
    "threads",
    "repeats",
    "switch",
)


def labels_for(variant: str, ids: torch.Tensor, segment_length: int) -> torch.Tensor:
    """Every token, or only the predictions inside the last segment (what `WindowCollator(loss_segments=1)` writes)."""
    if variant == "every-token":
        return ids
    labels = torch.full_like(ids, -100)
    start = ids.shape[1] - segment_length + 1
    labels[:, start:] = ids[:, start:]
    return labels


def measure(args: argparse.Namespace) -> dict:
    """A warm-up step on one segment, then the measured step and `repeats - 1` timed ones."""
    sys.path.insert(0, os.environ["HMT_ADAPTERS_CODE"])  # ahead of the checkout common.py puts first
    import hmt_adapters

    torch.set_num_threads(args.threads)
    model = build_model(args, args.switch)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.depth * args.segment_length), generator=gen).to(
        args.device
    )
    labels = labels_for(args.variant, ids, args.segment_length)
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step(n_tokens: int) -> torch.Tensor:
        with autocast:
            loss = model(input_ids=ids[:, :n_tokens], labels=labels[:, :n_tokens], return_logits=False).loss
        loss.backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return loss

    step(args.segment_length)
    model.zero_grad(set_to_none=True)
    result = {"variant": args.variant, "depth": args.depth, "switch": args.switch, "code": hmt_adapters.__file__}
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with PeakRSS() as rss:
        result["loss"] = float(step(ids.shape[1]))
    first = time.perf_counter() - start
    result["peak_rss_growth_mb"] = rss.growth / MB
    if args.device == "cuda":
        result["cuda_peak_growth_mb"] = (torch.cuda.max_memory_allocated() - before) / MB
    result["step_s"] = fastest_step(args, model, lambda: step(ids.shape[1]), first)
    result["tokens_per_s"] = ids.numel() / result["step_s"]
    return result


def export_previous(commit: str, folder: str) -> None:
    """The `hmt_adapters` package as of `commit`, written into `folder`."""
    archive = subprocess.run(
        ["git", "archive", commit, "hmt_adapters"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)


def run_worker(args: argparse.Namespace, variant: str, code: str) -> dict:
    """One variant in a fresh process, importing `hmt_adapters` from the folder `code`."""
    flags = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in MODEL_ARGS]
    return in_fresh_process(
        os.path.abspath(__file__),
        "--worker",
        variant,
        *flags,
        env={"MALLOC_MMAP_THRESHOLD_": "131072", "HMT_ADAPTERS_CODE": code},
    )


def table(results: list[dict], key: str) -> str:
    base = next(r for r in results if r["variant"] == "last-segment, previous code")
    lines = [
        f"{'variant':<30}{'step s':>9}{'tokens/s':>10}{'memory MB':>11}{'speed vs previous':>19}"
        f"{'memory vs previous':>20}"
    ]
    for r in results:
        lines.append(
            f"{r['variant']:<30}{r['step_s']:>9.2f}{r['tokens_per_s']:>10.0f}{r[key]:>11.0f}"
            f"{base['step_s'] / r['step_s']:>18.2f}x{r[key] / base[key]:>19.2f}x"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--depth", type=int, default=16)
    parser.add_argument("--switch", default="none", choices=tuple(SWITCHES))
    parser.add_argument("--previous", default="2355dae", help="commit of the code before the skip")
    parser.add_argument("--worker", metavar="VARIANT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.variant = args.worker
    return args


def main() -> None:
    args = parse_args()
    if answered_as_worker(args, measure):
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="hmt-previous-") as previous:
        export_previous(args.previous, previous)
        for variant in VARIANTS:
            results.append(run_worker(args, variant, previous if "previous" in variant else str(ROOT)))
            print(json.dumps(results[-1]), flush=True)
    key = "cuda_peak_growth_mb" if args.device == "cuda" else "peak_rss_growth_mb"
    print(table(results, key))
    write_result(
        "last_segment_loss" if args.device == "cpu" else "last_segment_loss_cuda",
        {
            "benchmark": "training step under last-segment loss: skip vs every-token loss vs previous code",
            "model": {k: getattr(args, k) for k in MODEL_ARGS if k not in ("threads", "repeats")}
            | {"method": "hmt", "sensory_length": 32, "memory_window": 16, "previous_commit": args.previous},
            "memory_metric": key,
            "results": results,
            "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
        },
    )


if __name__ == "__main__":
    main()
