"""Elastic Memory benchmarks: HiPPO reconstruction (the paper's Table 12), throughput against the bare backbone, and
memory-state bytes against a Memorizing-Transformer K/V FIFO holding the same history.

    .venv/bin/python benchmarks/elastic.py            # ~2-3 minutes on 2 CPU cores
    .venv/bin/python benchmarks/elastic.py --quick    # fewer repetitions and draws

Prints the tables and writes benchmarks/results/elastic.json and benchmarks/results/elastic.png.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import hmt_adapters as ha
from common import RESULTS, write_result  # benchmarks/ is the script folder
from hmt_adapters.methods.elastic import HiPPOLegS

# ---- Table 12 -------------------------------------------------------------------------------------------------

# (label, N, T, discretisation, paper MSE); the signals' frequencies are not in the paper: ours are below.
TABLE12 = [
    ("1 sine", 32, 1024, "zoh", 1.2e-5),
    ("3 sines", 32, 1024, "zoh", 2.3e-4),
    ("5 sines", 32, 1024, "zoh", 9.8e-4),
    ("5 sines", 32, 1024, "forward", 3.3e-3),
    ("5 sines", 32, 1024, "backward", 2.9e-3),
    ("5 sines", 32, 1024, "bilinear", 4.8e-4),
    ("random noise", 32, 1024, "zoh", 0.97),
    ("random noise", 128, 1024, "zoh", 0.90),
    ("random noise", 512, 1024, "zoh", 0.72),
]
CYCLES = {"1 sine": [3], "3 sines": [1, 3, 5], "5 sines": [1, 2, 3, 4, 5]}  # full periods over the T tokens


def signal(label: str, T: int, gen: torch.Generator) -> torch.Tensor:
    """One draw: sines with random amplitude in [0.5, 1.5) and phase, or unit white noise."""
    if label == "random noise":
        return torch.randn(T, generator=gen, dtype=torch.float64)
    x = (torch.arange(T, dtype=torch.float64) + 0.5) / T
    out = torch.zeros(T, dtype=torch.float64)
    for w in CYCLES[label]:
        amp = 0.5 + torch.rand((), generator=gen, dtype=torch.float64)
        phase = 2 * math.pi * torch.rand((), generator=gen, dtype=torch.float64)
        out += amp * torch.sin(2 * math.pi * w * x + phase)
    return out


def table12(draws: int) -> list[dict]:
    """Reconstruction MSE read at token midpoints (ours) and at token starts `x = p` (a half-token shift, one
    convention that may explain the paper's larger sine errors)."""
    rows = []
    for label, N, T, disc, paper in TABLE12:
        hippo = HiPPOLegS(N, disc, dtype=torch.float64)
        gen = torch.Generator().manual_seed(0)
        f = torch.stack([signal(label, T, gen) for _ in range(draws)])
        c = hippo.compress(f)
        mid = float(((hippo.reconstruct(c, T) - f) ** 2).mean())
        starts = c @ hippo.basis(torch.arange(T, dtype=torch.float64), T).T
        start = float(((starts - f) ** 2).mean())
        rows.append(dict(signal=label, N=N, T=T, discretization=disc, paper=paper, midpoints=mid, token_starts=start))
    return rows


# ---- throughput -------------------------------------------------------------------------------------------------


def small_llama() -> torch.nn.Module:
    config = LlamaConfig(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()


def extra_flops(cfg: ha.ElasticMemoryConfig, heads: int, kv_heads: int, head_dim: int) -> float:
    """Multiply-adds x 2 that one segment of the memory layer adds: attention over `L_mem` more keys, the
    readout `R C` and the update `P C + K F` for keys and values."""
    L, N, M = cfg.segment_length, cfg.hippo_order, cfg.readout_tokens
    attention = 2 * 2 * L * M * head_dim * heads
    readout = 2 * 2 * M * N * head_dim * kv_heads
    update = 2 * 2 * (N * N + N * L) * head_dim * kv_heads
    return attention + readout + update


def backbone_flops(model: torch.nn.Module, L: int) -> float:
    """Forward FLOPs of one segment: 2 x parameters x tokens (embeddings excluded) plus causal attention."""
    cfg = model.config
    params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n)
    attention = cfg.num_hidden_layers * 2 * 2 * (L * L / 2) * cfg.hidden_size
    return 2 * params * L + attention


def throughput(reps: int, segment: int, segments: int, orders: tuple[int, ...]) -> dict:
    """Tokens/s of the bare backbone and of elastic (uniform at each N in `orders`, exponential at the first) on
    the same segments, interleaved; one thread, so the ratios are not dominated by contention between threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    base = small_llama()
    base.requires_grad_(True)  # training mode: full backward through the backbone and the state (BPTT)
    ids = torch.randint(0, 8192, (1, segment * segments), generator=torch.Generator().manual_seed(0))
    models = {
        N: ha.wrap_with_memory(base, "elastic", segment_length=segment, hippo_order=N, freeze_backbone=False).eval()
        for N in orders
    }
    variants = {"bare": (orders[0], None)}  # name -> (N, sampling)
    for N in orders:
        variants[f"elastic_uni_N{N}"] = (N, "uniform")
    variants[f"elastic_exp_N{orders[0]}"] = (orders[0], "exponential")
    cold = {}
    for N, model in models.items():
        start = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids)  # builds the bank (P, K, R for every block position) once
        cold[N] = time.perf_counter() - start

    def run(name: str, train: bool) -> tuple[float, float]:
        """(wall seconds, process CPU seconds) of one pass; with one thread, CPU time is what other processes on
        the shared cores cannot inflate."""
        N, sampling = variants[name]
        model = models[N]
        if sampling is not None:
            model.memory.set_sampling(sampling)
        with model.disable_memory() if sampling is None else contextlib.nullcontext():
            wall, cpu = time.perf_counter(), time.process_time()
            if train:
                model(input_ids=ids, labels=ids).loss.backward()
                base.zero_grad(set_to_none=True)
            else:
                with torch.no_grad():
                    model(input_ids=ids)
            return time.perf_counter() - wall, time.process_time() - cpu

    results = {}
    for mode, train in (("inference", False), ("training", True)):
        for name in variants:
            run(name, train)  # warm-up
        walls, cpus = {name: [] for name in variants}, {name: [] for name in variants}
        for _ in range(reps):
            for name in variants:
                wall, cpu = run(name, train)
                walls[name].append(wall)
                cpus[name].append(cpu)
        results[mode] = {
            name: dict(
                tokens_per_s=ids.numel() / min(walls[name]),
                ratio_to_bare=statistics.median(b / t for b, t in zip(cpus["bare"], cpus[name])),
                wall_ratio_to_bare=min(walls["bare"]) / min(walls[name]),
            )
            for name in variants
        }
    torch.set_num_threads(threads)
    b = models[orders[0]].adapter
    results["flop_ratio"] = {
        f"N{N}": 1
        + extra_flops(models[N].memory_config, b.num_heads, b.num_kv_heads, b.head_dim) / backbone_flops(base, segment)
        for N in orders
    }
    results["bank_build_s"] = {f"N{N}": s for N, s in cold.items()}
    results["setup"] = dict(
        model="Llama from config: 4 layers, d=256, 4 heads (head_dim 64), vocab 8192, sdpa, fp32",
        segment_length=segment,
        segments=segments,
        hippo_orders=list(orders),
        memory_tokens="= N",
        memory_layer=models[orders[0]].memory.layers[0],
        repetitions=reps,
        threads=1,
    )
    return results


# ---- memory bytes -----------------------------------------------------------------------------------------------


def memory_bytes(order: int) -> dict:
    """Per memory layer: the Elastic state (fp32, constant) vs a Memorizing-Transformer FIFO holding the whole
    history (its K/V at bf16 and fp32), at the paper's 1x size (12 heads x 64 = 768 K/V channels)."""
    channels = 12 * 64
    histories = [2048, 8192, 32768, 131072, 1 << 20]
    elastic = 2 * order * channels * 4
    rows = [
        dict(
            history=T, elastic_fp32=elastic, memorizing_bf16=2 * T * channels * 2, memorizing_fp32=2 * T * channels * 4
        )
        for T in histories
    ]
    base = small_llama()
    measured = {}
    for tokens in (512, 2048):
        ids = torch.randint(0, 8192, (1, tokens), generator=torch.Generator().manual_seed(1))
        for method, kwargs in (
            ("elastic", dict(hippo_order=order)),
            ("transformer_xl", dict(memory_size=tokens, memory_layers=[3])),
        ):
            model = ha.wrap_with_memory(base, method, segment_length=512, **kwargs).eval()
            with torch.no_grad():
                _, state = model.step(ids)
            measured[f"{method}@{tokens}"] = sum(t.numel() * t.element_size() for t in state.tensors.values())
    return dict(channels=channels, hippo_order=order, rows=rows, measured_small_llama=measured)


# ---- report -------------------------------------------------------------------------------------------------------


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def print_report(t12: list[dict], speed: dict, mem: dict) -> None:
    print("\nTable 12: HiPPO-LegS reconstruction MSE (ours: mean over draws; sine frequencies are ours)")
    print(
        f"{'signal':<13} {'N':>4} {'T':>5} {'disc.':<9} {'paper':>9} {'ours (midpoints)':>17} "
        f"{'ours (token starts)':>20}"
    )
    for r in t12:
        print(
            f"{r['signal']:<13} {r['N']:>4} {r['T']:>5} {r['discretization']:<9} {r['paper']:>9.2g} "
            f"{r['midpoints']:>17.2e} {r['token_starts']:>20.2e}"
        )
    s = speed["setup"]
    print(
        f"\nThroughput ({s['model']}; {s['segments']} segments of {s['segment_length']}, L_mem = N, memory layer "
        f"{s['memory_layer']}; 1 thread, {s['repetitions']} interleaved runs: tok/s from the best wall time, ratio "
        "= median CPU-time ratio to bare)"
    )
    print(f"{'variant':<16} {'infer tok/s':>12} {'ratio':>7} {'train tok/s':>12} {'ratio':>7} {'FLOP ratio':>11}")
    for name in speed["inference"]:
        i, t = speed["inference"][name], speed["training"][name]
        flops = 1.0 if name == "bare" else speed["flop_ratio"][name.rsplit("_", 1)[1]]
        print(
            f"{name:<16} {i['tokens_per_s']:>12.0f} {i['ratio_to_bare']:>7.3f} {t['tokens_per_s']:>12.0f} "
            f"{t['ratio_to_bare']:>7.3f} {flops:>11.3f}"
        )
    print(
        "one-time bank build (cold first pass, seconds):",
        ", ".join(f"{k}: {v:.2f}" for k, v in speed["bank_build_s"].items()),
    )
    print(f"\nMemory per memory layer ({mem['channels']} K/V channels, N={mem['hippo_order']})")
    print(f"{'history':>9} {'elastic fp32':>13} {'MemTrans bf16':>14} {'MemTrans fp32':>14} {'ratio (bf16)':>13}")
    for r in mem["rows"]:
        print(
            f"{r['history']:>9} {human(r['elastic_fp32']):>13} {human(r['memorizing_bf16']):>14} "
            f"{human(r['memorizing_fp32']):>14} {r['memorizing_bf16'] / r['elastic_fp32']:>13.1f}"
        )
    print(
        "measured state bytes, small Llama (1 memory layer, 4 x 64 channels):",
        ", ".join(f"{k}: {human(v)}" for k, v in mem["measured_small_llama"].items()),
    )


def plot(t12: list[dict], mem: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    labels = [f"{r['signal']}\nN={r['N']} {r['discretization']}" for r in t12]
    x = torch.arange(len(t12)).tolist()
    w = 0.27
    a.bar([i - w for i in x], [r["paper"] for r in t12], w, label="paper")
    a.bar(x, [r["midpoints"] for r in t12], w, label="ours, token midpoints")
    a.bar([i + w for i in x], [r["token_starts"] for r in t12], w, label="ours, token starts")
    a.set_yscale("log")
    a.set_xticks(x, labels, fontsize=6, rotation=30, ha="right")
    a.set_ylabel("reconstruction MSE")
    a.set_title("HiPPO-LegS reconstruction (Table 12)")
    a.legend(fontsize=7)
    hist = [r["history"] for r in mem["rows"]]
    b.loglog(
        hist, [r["elastic_fp32"] for r in mem["rows"]], "o-", label=f"Elastic state, N={mem['hippo_order']} (fp32)"
    )
    b.loglog(hist, [r["memorizing_bf16"] for r in mem["rows"]], "s-", label="Memorizing-Transformer FIFO (bf16)")
    b.set_xlabel("history (tokens)")
    b.set_ylabel("bytes per memory layer")
    b.set_title("Memory for the same history")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and draws")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    t12 = table12(draws=4 if args.quick else 16)
    speed = throughput(reps=2 if args.quick else 5, segment=512, segments=4, orders=(128, 540))
    mem = memory_bytes(order=540)
    print_report(t12, speed, mem)
    out = dict(
        table12=t12,
        throughput=speed,
        memory=mem,
        notes=dict(
            table12="Sines: full periods over the sequence (1 sine: 3; 3 sines: 1,3,5; 5 sines: 1..5), random "
            "amplitude in [0.5,1.5) and phase; noise: unit white noise. 'midpoints' reads the state at x = p + 1/2 "
            "(where ZOH is exact for piecewise-constant input), 'token_starts' at x = p. The paper states neither "
            "convention.",
            throughput="ratio_to_bare = median over interleaved repetitions of bare CPU time / elastic CPU time on "
            "the same segments (one thread; process CPU time is not inflated by other processes on shared cores); "
            "wall_ratio_to_bare = best bare wall time / best elastic wall time; tokens_per_s from the best wall time. "
            "The bare backbone runs each segment alone (the same window). Shared CPU cores: noisy. FLOP ratio "
            "counts the memory layer's extra attention over L_mem keys, the readout R C and the update P C + K F "
            "against 2 x params x tokens + attention.",
        ),
        machine=dict(platform=platform.platform(), torch=torch.__version__, threads=torch.get_num_threads()),
    )
    write_result("elastic", out)
    plot(t12, mem, os.path.join(RESULTS, "elastic.png"))
    print(f"\nwrote {os.path.join(RESULTS, 'elastic.json')} and elastic.png")


if __name__ == "__main__":
    main()
