"""MELODI: memory per layer against Transformer-XL and the Memorizing Transformer, and throughput against the bare
backbone (docs/melodi.md). Run: `.venv/bin/python benchmarks/melodi.py` (a few minutes on 2 CPU cores).

1. Memory for the same history of `Q_max` windows, read off the state tensors the methods really allocate
   (`init_memory` and after streaming the history), at the paper's size (13 layers, D = 1024, W = 512, S128 + L64,
   Q_max = 128; MELODI §3.3, Table 3) and at a small size. Transformer-XL keeps the previous window's K/V in every
   layer; the Memorizing Transformer keeps that plus the K/V of all W * Q_max past tokens in one layer (dense, as
   MELODI re-implements it, Table 2); both are `"transformer_xl"` stores (`memory_size`, `memory_layers`).
2. Inference tokens/s of MELODI over the bare backbone on the same segments (`disable_memory()`: the backbone on
   each window alone), rounds interleaved and medians taken (the cores are shared and noisy), next to the FLOP
   ratio counted with `torch.utils.flop_counter` on eager attention.

Writes `benchmarks/results/melodi.json` and `benchmarks/results/melodi.png`.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hmt_adapters as ha  # noqa: E402
from common import RESULTS, write_result  # noqa: E402  (benchmarks/ is the script folder)

PAPER = dict(layers=13, dim=1024, heads=8, window=512, summary=128, long_term=64, windows=128)
SMALL = dict(layers=4, dim=128, heads=4, window=64, summary=16, long_term=8, windows=8)
SPEED = dict(
    layers=4, dim=256, heads=8, window=256, summary=64, long_term=32, windows=16, batch=2, segments=8, rounds=9
)


def llama(size: dict, ffn: int | None = None, vocab: int = 256, attn: str = "sdpa") -> torch.nn.Module:
    """A random Llama of `size` (multi-head K/V, as the paper counts `2 * D` floats per stored token)."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=size["dim"],
        intermediate_size=ffn or 4 * size["dim"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=size["window"] + size["summary"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()
    return model


def wrappers(size: dict, ffn: int) -> dict[str, ha.MemoryModel]:
    """MELODI, Transformer-XL and the long-term store of the Memorizing Transformer around one backbone (each call
    carries its own method's context, so the wrappers do not interfere)."""
    w, q, base = size["window"], size["windows"], llama(size, ffn)
    melodi = dict(summary_length=size["summary"], long_term_length=size["long_term"], long_term_windows=q)
    return {
        "melodi": ha.wrap_with_memory(base, "melodi", segment_length=w, **melodi),
        "transformer_xl": ha.wrap_with_memory(base, "transformer_xl", segment_length=w, memory_size=w),
        "memorizing_long_term": ha.wrap_with_memory(
            base, "transformer_xl", segment_length=w, memory_size=w * q, memory_layers=[size["layers"] // 2]
        ),
    }


def state_size(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    floats = sum(t.numel() for t in tensors.values() if t.is_floating_point())
    return {"floats": floats, "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}


def memory_table(size: dict, stream: bool) -> dict:
    """Floats and bytes each method keeps for a history of `Q_max` windows (per layer and in all)."""
    models = wrappers(size, ffn=64)  # the FFN width does not enter any state
    states = {name: m.init_memory(1).tensors for name, m in models.items()}
    if stream:  # fill every store with a real history and check nothing grew
        ids = torch.randint(0, 256, (1, size["window"] * (size["windows"] + 2)))
        with torch.no_grad():
            for name, m in models.items():
                _, state = m.step(ids)
                assert state_size(state.tensors) == state_size(states[name]), name
                states[name] = state.tensors
    n, d = size["layers"], size["dim"]
    melodi = states["melodi"]
    short = sum(t.numel() for k, t in melodi.items() if k.startswith("z."))
    rows = {
        "transformer_xl": {"short": state_size(states["transformer_xl"])["floats"], "long": 0},
        "memorizing_transformer": {
            "short": state_size(states["transformer_xl"])["floats"],
            "long": state_size(states["memorizing_long_term"])["floats"],
        },
        "melodi": {"short": short, "long": state_size(melodi)["floats"] - short},
    }
    byte_totals = {
        "transformer_xl": state_size(states["transformer_xl"])["bytes"],
        "memorizing_transformer": state_size(states["transformer_xl"])["bytes"]
        + state_size(states["memorizing_long_term"])["bytes"],
        "melodi": state_size(melodi)["bytes"],
    }
    for name, row in rows.items():
        row["total"] = row["short"] + row["long"]
        row["bytes_fp32"] = byte_totals[name]
        row["short_per_layer"] = row["short"] // n
        row["long_layer"] = row["long"]
        row["per_layer_mean"] = row["total"] / n
        row["bytes_per_layer_mean"] = byte_totals[name] / n
    for row in rows.values():
        row["x_melodi"] = row["total"] / rows["melodi"]["total"]
    check = {
        "melodi_short_formula": n * size["summary"] * d,
        "melodi_long_formula": 2 * size["long_term"] * size["windows"] * d,
        "memorizing_long_formula": 2 * size["window"] * size["windows"] * d,
    }
    assert rows["melodi"]["short"] == check["melodi_short_formula"]
    assert rows["melodi"]["long"] == check["melodi_long_formula"]
    assert rows["memorizing_transformer"]["long"] == check["memorizing_long_formula"]
    return {"size": size, "streamed": stream, "rows": rows, "formulas": check}


def read(model: ha.MemoryModel, ids: torch.Tensor, bare: bool) -> None:
    """One inference pass over `ids`; `bare` runs the backbone on each window alone (no memory, no summaries)."""
    with torch.no_grad(), model.disable_memory() if bare else contextlib.nullcontext():
        model(input_ids=ids, return_logits=False)


def timed(model: ha.MemoryModel, ids: torch.Tensor, bare: bool) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one pass."""
    wall, cpu = time.perf_counter(), time.process_time()
    read(model, ids, bare)
    return time.perf_counter() - wall, time.process_time() - cpu


def flops(model: ha.MemoryModel, ids: torch.Tensor, bare: bool) -> int:
    with FlopCounterMode(display=False) as counter:
        read(model, ids, bare)
    return counter.get_total_flops()


def melodi_model(size: dict, attn: str) -> ha.MemoryModel:
    return ha.wrap_with_memory(
        llama(size, attn=attn),
        "melodi",
        segment_length=size["window"],
        summary_length=size["summary"],
        long_term_length=size["long_term"],
        long_term_windows=size["windows"],
    )


def speed_table(size: dict) -> dict:
    """Bare backbone and MELODI on the same segments, timed back to back in alternating order each round.

    One thread, so process CPU time counts work rather than spin-waits; each round's pair gives one ratio, and the
    medians of those paired ratios are what the table reports (other jobs on the cores move both runs of a pair).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = melodi_model(size, "sdpa")
    ids = torch.randint(0, 256, (size["batch"], size["window"] * size["segments"]))
    timed(model, ids, bare=False)  # warm-up
    runs: dict[str, list[tuple[float, float]]] = {"bare": [], "melodi": []}
    for r in range(size["rounds"]):
        for name in ("bare", "melodi") if r % 2 == 0 else ("melodi", "bare"):
            runs[name].append(timed(model, ids, bare=name == "bare"))
    torch.set_num_threads(threads)
    eager = melodi_model(size, attn="eager")
    counted = {"bare": flops(eager, ids, bare=True), "melodi": flops(eager, ids, bare=False)}
    pairs = list(zip(runs["bare"], runs["melodi"]))
    return {
        "size": size,
        "threads": 1,
        "tokens_per_s": {name: ids.numel() / statistics.median(w for w, _ in v) for name, v in runs.items()},
        "speed_vs_bare_wall": statistics.median(b[0] / m[0] for b, m in pairs),
        "speed_vs_bare_cpu": statistics.median(b[1] / m[1] for b, m in pairs),
        "runs_wall_cpu_s": runs,
        "flops": counted,
        "flops_vs_bare": counted["melodi"] / counted["bare"],
    }


def print_memory(table: dict) -> None:
    s = table["size"]
    print(
        f"\nMemory for a history of Q_max={s['windows']} windows ({s['layers']} layers, D={s['dim']}, "
        f"W={s['window']}, "
        f"S{s['summary']}+L{s['long_term']}{', after streaming it' if table['streamed'] else ''}); floats unless noted"
    )
    print(
        f"{'method':24} {'short/layer':>12} {'long (1 layer)':>15} {'total':>12} {'mean/layer':>12} {'MB fp32':>9} "
        f"{'x MELODI':>9}"
    )
    for name, r in table["rows"].items():
        print(
            f"{name:24} {r['short_per_layer']:>12,} {r['long_layer']:>15,} {r['total']:>12,} "
            f"{r['per_layer_mean']:>12,.0f} {r['bytes_fp32'] / 2**20:>9.2f} {r['x_melodi']:>9.2f}"
        )
    ratio = table["rows"]["memorizing_transformer"]["long"] / table["rows"]["melodi"]["long"]
    print(f"long-term store, Memorizing / MELODI: {ratio:.1f}x (W / L)")


def print_speed(table: dict) -> None:
    s = table["size"]
    print(
        f"\nInference, {s['layers']}-layer Llama D={s['dim']}, batch {s['batch']} x {s['segments']} windows of "
        f"{s['window']} (S{s['summary']}+L{s['long_term']}), 1 thread, medians of {s['rounds']} back-to-back pairs"
    )
    print(f"{'':8} {'tokens/s':>10} {'x bare (wall)':>14} {'x bare (CPU)':>13} {'FLOPs x bare':>13}")
    print(f"{'bare':8} {table['tokens_per_s']['bare']:>10,.0f} {1:>14.2f} {1:>13.2f} {1:>13.2f}")
    print(
        f"{'melodi':8} {table['tokens_per_s']['melodi']:>10,.0f} {table['speed_vs_bare_wall']:>14.2f} "
        f"{table['speed_vs_bare_cpu']:>13.2f} {table['flops_vs_bare']:>13.2f}"
    )


def plot(paper: dict, speed: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = list(paper["rows"])
    short = [paper["rows"][n]["short"] / 1e6 for n in names]
    long = [paper["rows"][n]["long"] / 1e6 for n in names]
    left.bar(names, short, label="short-term (all layers)")
    left.bar(names, long, bottom=short, label="long-term (one layer)")
    left.set_ylabel("memory (M floats)")
    left.set_title("History of 128 windows, 13 x 1024, W=512, S128+L64")
    left.legend()
    ratios = {
        "wall": speed["speed_vs_bare_wall"],
        "CPU": speed["speed_vs_bare_cpu"],
        "1 / FLOPs": 1 / speed["flops_vs_bare"],
    }
    right.bar(list(ratios), list(ratios.values()), color=["tab:blue", "tab:cyan", "tab:gray"])
    right.axhline(1.0, color="k", lw=0.8)
    right.set_ylabel("MELODI speed / bare backbone")
    right.set_title("Inference throughput (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    torch.manual_seed(0)
    started = time.perf_counter()
    paper = memory_table(PAPER, stream=False)
    print_memory(paper)
    small = memory_table(SMALL, stream=True)
    print_memory(small)
    speed = speed_table(SPEED)
    print_speed(speed)
    out = {
        "command": "python benchmarks/melodi.py",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "seconds": round(time.perf_counter() - started, 1),
        "memory_paper_size": paper,
        "memory_small_streamed": small,
        "inference": speed,
    }
    write_result("melodi", out)
    plot(paper, speed, RESULTS / "melodi.png")
    print(f"\nwrote {RESULTS / 'melodi.json'} and melodi.png in {out['seconds']} s")


if __name__ == "__main__":
    main()
