"""What memory costs at inference, for every method against the bare backbone (docs/cost.md).

1. throughput: tokens/s of each wrapped model over 16 segments of 512 tokens against the bare backbone on the same
   segments (memory disabled: each segment alone), next to the FLOP ratio the method must pay (counted by
   `torch.utils.flop_counter` on an eager-attention copy); rounds interleaved so ratios share the machine's noise;
2. streaming memory: peak RSS a `step` stream adds at 4k, 10k, 100k and 1M tokens (a fresh process per point; a 2-layer
   model);
3. generation: decode tokens/s of `generate` with memory (a prompt of 7.5 segments, then one segment's worth of new
   tokens, one fold into memory included) against the bare backbone's `generate` inside one window, on the 4-layer
   model (`decode`) and on SmolLM2-135M with 256-token segments (`decode_smollm2`, ~15 min: not in the default parts,
   and a default run starts a new cost.json, so add it afterwards with `--parts decode_smollm2`); peak RSS against
   prompt length.

    python benchmarks/cost.py [--methods hmt rmt ...] [--lengths 4096 10240 102400 1048576] [--parts decode ...]

Writes `benchmarks/results/cost.json` and `benchmarks/results/cost.png`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import (  # noqa: E402
    RESULTS,
    counted_flops,
    in_fresh_process,
    interleaved_medians,
    interleaved_speed,
    peak_ratio,
    peak_rss_bytes,
    provenance,
    pyplot,
    rss_bytes,
    small_llama,
    write_result,
)

SEGMENT = 512
SEGMENTS = 16
SMOLLM2_SEGMENT = 256
DEFAULT_PARTS = ["throughput", "stream", "decode", "generate"]
TINY = dict(layers=2, dim=64, heads=4, kv_heads=2, ffn=128, vocab=8192)


def wrapped(method: str, attn: str = "sdpa", **size) -> ha.MemoryModel:
    return ha.wrap_with_memory(small_llama(attn=attn, **size), method, segment_length=SEGMENT).eval()


def document(length: int, vocab: int = 8192, batch: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def read_memory(model: ha.MemoryModel, ids: torch.Tensor) -> int:
    model(input_ids=ids, labels=ids)  # the loss on every token, as bare (a bare run without targets runs nothing)
    return ids.numel()


@torch.no_grad()
def read_bare(model: ha.MemoryModel, ids: torch.Tensor) -> int:
    with model.disable_memory():
        model(input_ids=ids, labels=ids)
    return ids.numel()


def throughput(methods: list[str]) -> dict:
    ids = document(SEGMENT * SEGMENTS)
    models = {m: wrapped(m) for m in methods}
    runs = {"bare": lambda: read_bare(models[methods[0]], ids)}
    runs.update({m: (lambda m=m: read_memory(models[m], ids)) for m in methods})
    speed = interleaved_speed(runs, rounds=3)
    eager = {m: wrapped(m, attn="eager") for m in methods}
    flops = {"bare": counted_flops(lambda: read_bare(eager[methods[0]], ids))}
    flops.update({m: counted_flops(lambda m=m: read_memory(eager[m], ids)) for m in methods})
    return {
        name: {
            "tokens_per_s": speed[name],
            "speed_vs_bare": speed[name] / speed["bare"],
            "flops_vs_bare": flops[name]["total"] / flops["bare"]["total"],
            "attention_flops_vs_bare": flops[name]["attention"] / flops["bare"]["attention"],
        }
        for name in runs
    }


def peaks(before: int) -> dict:
    """The process's peak RSS (MB) and what it added to `before` (the RSS with the model built)."""
    peak = peak_rss_bytes()
    return {"peak_mb": peak / 2**20, "peak_extra_mb": (peak - before) / 2**20}


def stream_worker(method: str, length: int) -> dict:
    """In a fresh process: stream `length` tokens through `step` 8 segments at a time; peak RSS it adds."""
    torch.set_num_threads(1)
    model = wrapped(method, **TINY)
    state, before, start = model.init_memory(1), rss_bytes(), time.perf_counter()
    chunk = 8 * SEGMENT
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for offset in range(0, length, chunk):
            size = min(chunk, length - offset)
            state = model.step(torch.randint(0, TINY["vocab"], (1, size), generator=gen), state)[1]  # logits freed
    seconds = time.perf_counter() - start
    return {**peaks(before), "tokens_per_s": length / seconds}


def generate_worker(method: str, prompt: int) -> dict:
    """In a fresh process: generate 16 tokens after a `prompt`-token prompt; the peak RSS it adds."""
    torch.set_num_threads(1)
    model = wrapped(method, **TINY)
    ids = document(prompt, TINY["vocab"])
    before = rss_bytes()
    model.generate(input_ids=ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    return peaks(before)


def decode_speed(methods: list[str], backbone: str = "tiny", rounds: int = 3) -> dict:
    """Decode tokens/s of `generate` with memory against the bare backbone's `generate` in one window; medians over
    interleaved rounds after a warm-up (which builds any cached matrices).

    With memory, the prompt ends half a segment before a boundary and one segment's worth of tokens is decoded, so
    each run folds exactly one segment into memory: the steady-state cost per token, folding included.
    """
    if backbone == "smollm2":
        segment, build = SMOLLM2_SEGMENT, lambda: ha.backbones.smollm2()[0].eval()
    else:
        segment, build = SEGMENT, small_llama
    greedy = dict(do_sample=False, pad_token_id=0)

    def decode_rate(model, ids) -> Callable[[], float]:
        def timed(new: int) -> float:
            start = time.perf_counter()
            model.generate(input_ids=ids, max_new_tokens=new, min_new_tokens=new, **greedy)
            return time.perf_counter() - start

        return lambda: segment / (timed(segment + 1) - timed(1))  # the prompt's prefill cancels out

    bare = build()
    vocab = bare.config.vocab_size
    runs = {"bare": decode_rate(bare, document(1, vocab))}
    prompt = document(8 * segment - segment // 2, vocab)
    runs.update(
        {m: decode_rate(ha.wrap_with_memory(build(), m, segment_length=segment).eval(), prompt) for m in methods}
    )
    speed = interleaved_medians(runs, rounds)
    return {name: {"decode_tokens_per_s": rate, "vs_bare": rate / speed["bare"]} for name, rate in speed.items()}


def in_fresh_processes(kind: str, methods: list[str], lengths: list[int]) -> dict:
    """`{method: {length: worker result}}`, each point measured by a `--worker kind` in a fresh process."""
    return {m: {str(n): in_fresh_process(__file__, "--worker", kind, m, str(n)) for n in lengths} for m in methods}


def print_tables(result: dict) -> None:
    print(f"Throughput: 4-layer Llama D=256, {SEGMENTS} segments of {SEGMENT} tokens, fp32 CPU")
    print(f"{'run':24} {'tok/s':>8} {'x bare':>7} {'FLOPs x':>8} {'attn FLOPs x':>13}")
    for name, r in result["throughput"].items():
        print(
            f"{name:24} {r['tokens_per_s']:8,.0f} {r['speed_vs_bare']:7.2f} {r['flops_vs_bare']:8.2f} "
            f"{r['attention_flops_vs_bare']:13.2f}"
        )
    lengths = result["lengths"]
    for part, title in (("stream", "a step() stream"), ("generate", "generate() after a prompt")):
        print(f"\nPeak RSS of {title}, 2-layer model: added to the built model (MB) at each length; peak ratio")
        print(f"{'method':24} " + " ".join(f"{n:>9,}" for n in lengths) + "   peak last/first")
        for m, row in result[part].items():
            added = " ".join(f"{row[str(n)]['peak_extra_mb']:9.1f}" for n in lengths)
            print(f"{m:24} {added}   {peak_ratio(row, lengths):9.3f}")
    for decode, model in (("decode", "4-layer Llama"), ("decode_smollm2", "SmolLM2-135M")):
        if decode in result:
            print(
                f"\nGeneration on {model}: decode tokens/s (one segment after 7.5) vs the bare backbone in one window"
            )
            for m, r in result[decode].items():
                print(f"{m:24} {r['decode_tokens_per_s']:8.1f} tok/s   x bare {r['vs_bare']:.2f}")


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    names = list(result["throughput"])
    left.bar(names, [result["throughput"][n]["speed_vs_bare"] for n in names], label="tokens/s vs bare")
    left.plot(names, [1 / result["throughput"][n]["flops_vs_bare"] for n in names], "ko--", label="1 / FLOP ratio")
    left.tick_params(axis="x", rotation=45)
    left.set_title("Inference throughput relative to the bare backbone")
    left.legend()
    lengths = result["lengths"]
    for m, row in result["stream"].items():
        right.plot(lengths, [row[str(n)]["peak_extra_mb"] for n in lengths], marker="o", label=m)
    right.set(xscale="log", xlabel="tokens streamed", ylabel="peak RSS added (MB)", title="Memory against length")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=ha.available_methods())
    parser.add_argument("--lengths", nargs="+", type=int, default=[4096, 10240, 102400, 1048576])
    parser.add_argument(
        "--parts",
        nargs="+",
        default=DEFAULT_PARTS,
        choices=DEFAULT_PARTS + ["decode_smollm2"],
        help="what to measure; a subset of parts or methods updates the existing cost.json",
    )
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "METHOD", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, method, length = args.worker
        print(json.dumps((stream_worker if kind == "stream" else generate_worker)(method, int(length))))
        return
    torch.set_num_threads(2)
    parts = {
        "throughput": lambda: throughput(args.methods),
        "stream": lambda: in_fresh_processes("stream", args.methods, args.lengths),
        "decode": lambda: decode_speed(args.methods),
        "decode_smollm2": lambda: decode_speed(args.methods, "smollm2", rounds=2),
        "generate": lambda: in_fresh_processes("generate", args.methods, args.lengths),
    }
    result = {"segment_length": SEGMENT, "lengths": args.lengths}
    if args.parts != DEFAULT_PARTS or args.methods != ha.available_methods():  # update the last run's results
        result = json.loads((RESULTS / "cost.json").read_text())
        result.setdefault("full_run", result.pop("provenance"))
        result.setdefault("remeasured", {})
        for part in args.parts:
            result["remeasured"][part] = provenance()
    for part in args.parts:
        result[part] = {**result.get(part, {}), **parts[part]()}  # re-measured methods replace their rows
    path = write_result("cost", result)
    plot(result, path.with_suffix(".png"))
    print_tables(result)


if __name__ == "__main__":
    main()
