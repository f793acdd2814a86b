"""Attention-level memory (Transformer-XL, TRAMS, Memorizing Transformer, UniMix): inference cost against the bare
backbone on the same segments (docs/cost.md). Run: `.venv/bin/python benchmarks/attention_cost.py` (a few minutes).

- bare: the same wrapped model read with memory disabled (each segment alone, the same runtime); every run, bare
  included, computes the loss on every token, so the LM head runs on every token of every run (docs/cost.md);
- tokens/s: the process's CPU time (one thread; other jobs on the two shared cores inflate wall-clock time, not
  this), median over interleaved rounds (all runs in one process, so the ratios share the machine's state);
- FLOPs: counted by `torch.utils.flop_counter` on an eager-attention copy (sdpa on CPU is not counted); attention
  FLOPs are those inside the attention modules minus their projections (scores, weighted values, memory reading
  including the top-k scores and the TRAMS metric), the rest is projections, MLP and LM head;
- peak memory: each run in its own process, peak RSS (`VmHWM`, reset once the model is built) minus the RSS then,
  i.e. what one forward over the document adds; plus the bytes of the memory state itself.

TRAMS must attend to fewer keys than Transformer-XL over its whole pool (m + n instead of M + n, TRAMS §3.6): the
script checks that its attention FLOPs are below XL's with `memory_size = M` and prints both.
Writes `benchmarks/results/attention_cost.json` and `benchmarks/results/attention_cost.png`.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hmt_adapters as ha  # noqa: E402
from common import RESULTS, counted_flops, in_fresh_process, small_llama, write_result  # noqa: E402  (benchmarks/ is the script folder)

SIZE = dict(layers=4, dim=256, heads=8, kv_heads=4, ffn=688, vocab=8192, segment=128, segments=16, batch=2, rounds=5)
N = SIZE["segment"]
# name -> (method string, overrides). TRAMS: pool M = 4n, attended m = 2n (the paper's M = 2m; code split r = 3m/4).
RUNS: dict[str, tuple[str | None, dict]] = {
    "bare": (None, {}),
    "transformer_xl": ("transformer_xl", {"memory_size": N}),
    "transformer_xl_m": ("transformer_xl", {"memory_size": 2 * N}),
    "transformer_xl_M": ("transformer_xl", {"memory_size": 4 * N}),
    "trams": ("trams", {"memory_size": 4 * N, "select_size": 2 * N}),
    "memorizing_transformer": ("memorizing_transformer", {}),
    "unimix": ("unimix", {}),
}


def build(name: str, attn: str = "sdpa") -> ha.MemoryModel:
    """The run's wrapped model; `bare` is a wrapped model read with memory disabled (the same runtime)."""
    method, overrides = RUNS[name]
    base = small_llama(SIZE["layers"], SIZE["dim"], SIZE["heads"], SIZE["kv_heads"], SIZE["ffn"], SIZE["vocab"], attn)
    return ha.wrap_with_memory(base, method or "rmt", segment_length=N, **overrides).eval()


def document() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, SIZE["vocab"], (SIZE["batch"], N * SIZE["segments"]), generator=gen)


def read(model: ha.MemoryModel, ids: torch.Tensor, bare: bool = False) -> None:
    """One evaluation pass over `ids` with the loss on every token (the LM head runs on every token of every run);
    `bare`: memory disabled, the backbone on each segment alone through the same runtime (docs/cost.md)."""
    with torch.no_grad():
        if bare:
            with model.disable_memory():
                model(input_ids=ids, labels=ids)
        else:
            model(input_ids=ids, labels=ids)


def speed(models: dict, ids: torch.Tensor) -> dict[str, list[float]]:
    runs = {name: [] for name in models}
    for name, model in models.items():
        read(model, ids, name == "bare")  # warm-up
    for r in range(SIZE["rounds"]):
        for name in list(models) if r % 2 == 0 else list(reversed(models)):
            start = time.process_time()  # CPU time: other jobs on the shared cores do not inflate it
            read(models[name], ids, name == "bare")
            runs[name].append(ids.numel() / (time.process_time() - start))
    return runs


def flops(name: str, ids: torch.Tensor) -> dict[str, int]:
    model = build(name, attn="eager")
    return counted_flops(lambda: read(model, ids, name == "bare"))


def state_bytes(name: str, ids: torch.Tensor) -> int:
    model = build(name)
    if name == "bare":
        return 0
    with torch.no_grad():
        _, state = model.step(ids)
    return sum(t.numel() * t.element_size() for t in state.tensors.values())


def status_bytes(field: str) -> int:
    """`VmRSS` (resident now) or `VmHWM` (peak resident since the last reset) of this process, in bytes."""
    with open("/proc/self/status") as fh:
        line = next(line for line in fh if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


def peak_memory_child(name: str) -> None:
    """In a fresh process: what one forward over the document adds to the RSS of the built model (bytes)."""
    torch.set_num_threads(1)
    model, ids = build(name), document()
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset the peak (VmHWM) to the current RSS: model building does not count
    before = status_bytes("VmRSS")
    read(model, ids, name == "bare")
    print(json.dumps({"peak_extra": status_bytes("VmHWM") - before}))


def peak_memory(name: str) -> int:
    return in_fresh_process(__file__, "--peak", name)["peak_extra"]


def keys_per_query(name: str, model: ha.MemoryModel) -> str:
    if name == "bare":
        return f"n={N}"
    s = model.memory.settings
    return {
        "all": f"{s.memory_size}+n",
        "trams": f"{s.select_size}+n (of {s.memory_size})",
        "topk": f"{s.topk}+n (scores over {s.memory_size})",
        "union": f"{s.window}+{s.global_tokens}+{s.topk}+n (scores over {s.memory_size}), "
        f"+{2 * s.memory_tokens} slots",
    }[s.reading]


def measure() -> dict:
    ids = document()
    models = {name: build(name) for name in RUNS}
    runs = speed(models, ids)
    tps = {name: statistics.median(v) for name, v in runs.items()}
    counted = {name: flops(name, ids) for name in RUNS}
    peaks = {name: peak_memory(name) for name in RUNS}
    rows = {}
    for name in RUNS:
        rows[name] = {
            "method": RUNS[name][0],
            "overrides": RUNS[name][1],
            "keys_per_query": keys_per_query(name, models[name]),
            "memory_layers": list(models[name].memory.layers) if name != "bare" else [],
            "tokens_per_s": tps[name],
            "speed_vs_bare": tps[name] / tps["bare"],
            "flops": counted[name]["total"],
            "flops_vs_bare": counted[name]["total"] / counted["bare"]["total"],
            "attention_flops": counted[name]["attention"],
            "attention_flops_vs_bare": counted[name]["attention"] / counted["bare"]["attention"],
            "peak_extra_mb": peaks[name] / 2**20,
            "state_mb": state_bytes(name, ids) / 2**20,
        }
    trams, xl_pool = rows["trams"]["attention_flops"], rows["transformer_xl_M"]["attention_flops"]
    assert trams < xl_pool, f"TRAMS attention ({trams}) must be cheaper than XL over the whole pool ({xl_pool})"
    return {"rows": rows, "runs": runs, "trams_attention_vs_xl_pool": trams / xl_pool}


def print_table(result: dict) -> None:
    s = SIZE
    print(
        f"{s['layers']}-layer Llama D={s['dim']} ({s['heads']} query / {s['kv_heads']} KV heads), batch {s['batch']} "
        f"x {s['segments']} segments of n={N}, fp32 CPU, {torch.get_num_threads()} thread(s), median of "
        f"{s['rounds']} rounds"
    )
    head = (
        f"{'run':24} {'keys per query (memory layers)':58} {'tok/s':>7} {'x bare':>7} {'FLOPs x':>8} "
        f"{'attn x':>7} {'peak MB':>8} {'state MB':>9}"
    )
    print(head)
    for name, r in result["rows"].items():
        print(
            f"{name:24} {r['keys_per_query']:58} {r['tokens_per_s']:>7,.0f} {r['speed_vs_bare']:>7.2f} "
            f"{r['flops_vs_bare']:>8.2f} "
            f"{r['attention_flops_vs_bare']:>7.2f} {r['peak_extra_mb']:>8.1f} {r['state_mb']:>9.2f}"
        )
    print(f"TRAMS attention FLOPs / Transformer-XL over the whole pool M: {result['trams_attention_vs_xl_pool']:.2f}")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    names = list(rows)
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.8))
    left.bar(names, [rows[n]["speed_vs_bare"] for n in names], label="tokens/s vs bare")
    left.plot(names, [1 / rows[n]["flops_vs_bare"] for n in names], "ko--", label="1 / FLOP ratio")
    left.set_ylabel("relative to the bare backbone")
    left.set_title("Inference throughput (CPU, same segments)")
    left.legend()
    middle.bar(names, [rows[n]["attention_flops_vs_bare"] for n in names], color="tab:orange")
    middle.set_ylabel("attention FLOPs / bare")
    middle.set_title("Attention FLOPs (TRAMS: m + n keys, XL_M: M + n)")
    right.bar(names, [rows[n]["peak_extra_mb"] for n in names], color="tab:green", label="peak added by a forward")
    right.bar(names, [rows[n]["state_mb"] for n in names], color="tab:red", label="memory state")
    right.set_ylabel("MB")
    right.set_title("Memory (fp32)")
    right.legend()
    for axis in (left, middle, right):
        plt.setp(axis.get_xticklabels(), rotation=35, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    torch.set_num_threads(1)  # 2 threads on 2 shared cores oversubscribe and slow small models down many times
    started = time.perf_counter()
    result = measure()
    print_table(result)
    out = {
        "command": "python benchmarks/attention_cost.py",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "size": SIZE,
        "seconds": round(time.perf_counter() - started, 1),
        **result,
    }
    plot(result, write_result("attention_cost", out).with_suffix(".png"))
    print(f"wrote {RESULTS / 'attention_cost.json'} and attention_cost.png in {out['seconds']} s")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--peak":
        peak_memory_child(sys.argv[2])
    else:
        main()
