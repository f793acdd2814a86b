"""Peak training memory against BPTT depth (2, 4, 8, 16 segments) for the memory-saving switches of a `MemoryModel`.

One training step (forward with labels through all segments, backward) of HMT on a randomly initialised Llama, for
each switch (none, offload, checkpointing, both) and depth, each in a fresh process:

- CPU (default): peak process RSS growth during the step, and the bytes of non-parameter tensors autograd holds for
  backward at the end of the forward pass, counted by saved-tensor hooks. On a CPU, "offloading" to host memory moves
  nothing, so the offload hooks are metered instead: what they would move off a GPU counts as host bytes, the rest as
  device bytes. RSS therefore only falls with checkpointing here; run on a GPU for offload's real effect.
- CUDA (`--device cuda`): `torch.cuda.max_memory_allocated` growth during the step (the real offload hooks run; the
  host column is then not metered).

    .venv/bin/python benchmarks/training_memory.py                  # CPU, ~5-10 minutes on 2 cores
    python benchmarks/training_memory.py --device cuda --hidden 1024 --layers 12 --segment-length 512
    python benchmarks/training_memory.py --device cuda --dtype bf16 --hidden 1024 --layers 12 --segment-length 512

`--dtype bf16` runs the step under `torch.autocast(dtype=torch.bfloat16)` over fp32 weights (what the `Trainer`'s
`bf16=True` does); `--switches` picks a subset of the four switches.

Prints a table and writes benchmarks/results/training_memory[_cuda].json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable

import torch

from common import RESULTS, in_fresh_process, rss_bytes, write_result  # benchmarks/ is the script folder

SWITCHES = {
    "none": {},
    "offload": {"offload_activations": True},
    "checkpointing": {"gradient_checkpointing": True},
    "both": {"offload_activations": True, "gradient_checkpointing": True},
}
GOAL_RATIO = 1.5  # with both switches, depth 16 may cost at most 1.5x depth 2
MB = 2**20


# ---- measuring (worker process) ---------------------------------------------------------------------------------


class SavedBytes:
    """Live bytes of non-parameter storages held for backward, in two pools: on the device and moved to the host.

    A storage saved by several autograd nodes (or through several views) counts once, while any of them holds it.
    """

    def __init__(self, parameters):
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in parameters}
        self.live = {"device": 0, "host": 0}
        self._holders: dict[tuple[str, int], int] = {}

    def hold(self, t: torch.Tensor, pool: str):
        storage = t.untyped_storage()
        if storage.data_ptr() in self.param_ptrs:
            return t
        key = (pool, storage.data_ptr())
        if key not in self._holders:
            self.live[pool] += storage.nbytes()
        self._holders[key] = self._holders.get(key, 0) + 1
        return _Held(self, t, key, storage.nbytes())

    def release(self, key: tuple[str, int], nbytes: int) -> None:
        self._holders[key] -= 1
        if not self._holders[key]:
            del self._holders[key]
            self.live[key[0]] -= nbytes

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(lambda t: self.hold(t, "device"), _unpack)


class _Held:
    """A saved tensor; its storage counts in the meter until autograd frees the last holder."""

    def __init__(self, meter: SavedBytes, t: torch.Tensor, key: tuple[str, int], nbytes: int):
        self.meter, self.t, self.key, self.nbytes = meter, t, key, nbytes

    def __del__(self):
        self.meter.release(self.key, self.nbytes)


def _unpack(packed):
    return packed.t if isinstance(packed, _Held) else packed


def metered_offload(meter: SavedBytes):
    """On a CPU, the runtime's offload hooks keep every tensor in place; count what they would move as host bytes."""
    from hmt_adapters.training import ActivationOffload

    class MeteredOffload(ActivationOffload):
        def _pack(self, t):
            if t.numel() * t.element_size() < self.min_bytes:
                return meter.hold(t, "device")
            return meter.hold(t, "host")

        _unpack = staticmethod(_unpack)

    return MeteredOffload


class PeakRSS:
    """Samples the process RSS every millisecond in a thread; `growth` is the largest value seen minus the first."""

    def __init__(self):
        self.start = self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    now = staticmethod(rss_bytes)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.001)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())

    @property
    def growth(self) -> int:
        return self.peak - self.start


def build_model(args: argparse.Namespace, switch: str):
    from transformers import AutoModelForCausalLM, LlamaConfig

    import hmt_adapters as ha

    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads or args.heads,
        max_position_embeddings=2 * args.segment_length,
    )
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float()
    return ha.wrap_with_memory(
        base, "hmt", segment_length=args.segment_length, sensory_length=32, memory_window=16, **SWITCHES[switch]
    ).to(args.device)


def autocast(args: argparse.Namespace):
    """bf16 autocast over the fp32 weights for `--dtype bf16`, nothing for fp32."""
    return torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")


def train_step(model, ids: torch.Tensor, args: argparse.Namespace) -> None:
    with autocast(args):
        loss = model(input_ids=ids, labels=ids, return_logits=False).loss
    loss.backward()


def measure(args: argparse.Namespace) -> dict:
    """One (switch, depth) configuration: a warm-up step on one segment, then the measured step."""
    torch.set_num_threads(args.threads)
    model = build_model(args, args.switch)
    meter = SavedBytes(model.parameters())
    if args.device == "cpu":
        model.runtime.offload_class = metered_offload(meter)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.batch_size, args.depth * args.segment_length), generator=gen).to(
        args.device
    )
    train_step(model, ids[:, : args.segment_length], args)
    model.zero_grad(set_to_none=True)
    result = {"switch": args.switch, "depth": args.depth}
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    start = time.perf_counter()
    with PeakRSS() as rss, meter.hooks():
        with autocast(args):
            loss = model(input_ids=ids, labels=ids, return_logits=False).loss
        result["saved_device_mb"] = meter.live["device"] / MB
        result["saved_host_mb"] = meter.live["host"] / MB
        loss.backward()
        if args.device == "cuda":
            torch.cuda.synchronize()
    first = time.perf_counter() - start
    result["peak_rss_growth_mb"] = rss.growth / MB
    if args.device == "cuda":
        result["cuda_peak_growth_mb"] = (torch.cuda.max_memory_allocated() - before) / MB
    result["step_s"] = fastest_step(args, model, lambda: train_step(model, ids, args), first)
    return result


def fastest_step(args: argparse.Namespace, model: torch.nn.Module, step: Callable[[], object], first: float) -> float:
    """Seconds of the least disturbed of `args.repeats` steps on a shared machine: the measured first one (`first`)
    and `args.repeats - 1` more of `step` (CUDA synchronised)."""
    times = [first]
    for _ in range(args.repeats - 1):
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


# ---- orchestration ----------------------------------------------------------------------------------------------

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
    "threads",
    "repeats",
)


def run_worker(args: argparse.Namespace, switch: str, depth: int) -> dict:
    """Measure one configuration in a fresh process (a clean peak), freed tensors returned to the OS at once."""
    flags = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in MODEL_ARGS]
    return in_fresh_process(
        os.path.abspath(__file__), "--worker", switch, str(depth), *flags, env={"MALLOC_MMAP_THRESHOLD_": "131072"}
    )


def memory_key(device: str) -> str:
    return "cuda_peak_growth_mb" if device == "cuda" else "peak_rss_growth_mb"


def summarise(results: list[dict], key: str, depths: list[int], switches: list[str]) -> dict:
    """Per switch: memory at the deepest over the shallowest depth, and mean step time over no switch (when
    measured)."""
    by = {(r["switch"], r["depth"]): r for r in results}
    summary = {}
    for switch in switches:
        summary[switch] = {
            "memory_ratio": by[(switch, depths[-1])][key] / by[(switch, depths[0])][key],
            "step_s": {d: by[(switch, d)]["step_s"] for d in depths},
            "time_ratio_vs_none": (
                sum(by[(switch, d)]["step_s"] / by[("none", d)]["step_s"] for d in depths) / len(depths)
                if "none" in switches
                else None
            ),
        }
    return summary


def table(results: list[dict], key: str, depths: list[int], summary: dict, switches: list[str]) -> str:
    by = {(r["switch"], r["depth"]): r for r in results}
    head = (
        f"{'switch':<14}"
        + "".join(f"{f'depth {d}':>22}" for d in depths)
        + f"{f'{depths[-1]}/{depths[0]}':>9}{'time x':>8}"
    )
    lines = [
        f"peak memory growth in MB ({key}); in brackets: saved activations on the device / moved to host, MB",
        head,
    ]
    for switch in switches:
        cells = "".join(
            f"{by[(switch, d)][key]:>9.0f} "
            f"({by[(switch, d)]['saved_device_mb']:.0f}/{by[(switch, d)]['saved_host_mb']:.0f})".rjust(22)
            for d in depths
        )
        s = summary[switch]
        time_ratio = "-" if s["time_ratio_vs_none"] is None else f"{s['time_ratio_vs_none']:.2f}x"
        lines.append(f"{switch:<14}{cells}{s['memory_ratio']:>8.2f}x{time_ratio:>8}")
    return "\n".join(lines)


def plot(results: list[dict], key: str, depths: list[int], path: str, switches: list[str]) -> None:
    """Two panels against depth: peak memory growth, and the saved activations left on the device after forward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = ((key, "peak memory growth of the step (MB)"), ("saved_device_mb", "activations kept on the device (MB)"))
    for ax, (field, label) in zip(axes, panels):
        for switch, style in zip(switches, ("o-", "s--", "^-", "x:")):
            values = [next(r[field] for r in results if r["switch"] == switch and r["depth"] == d) for d in depths]
            ax.plot(depths, values, style, label=switch)
        ax.set(xlabel="BPTT depth (segments)", ylabel=label, xticks=depths)
    axes[0].legend()
    fig.suptitle(f"One HMT training step against BPTT depth ({key})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def answered_as_worker(args: argparse.Namespace, measure: Callable[[argparse.Namespace], dict]) -> bool:
    """In a `--worker` process, print `measure(args)` as the JSON line the parent reads and say so; in the parent,
    refuse `--device cuda` without a CUDA device before any worker starts."""
    if args.worker:
        print(json.dumps(measure(args)))
        return True
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch.")
    return False


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The model, device and timing options every training-step benchmark takes (`MODEL_ARGS` passes them to
    workers)."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast over fp32 weights")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=0, help="key/value heads (0: as many as --heads)")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--segment-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per configuration (the fastest is kept)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_args(parser)
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--switches", nargs="+", choices=tuple(SWITCHES), default=list(SWITCHES))
    parser.add_argument("--worker", nargs=2, metavar=("SWITCH", "DEPTH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.switch, args.depth = args.worker[0], int(args.worker[1])
    return args


def main() -> None:
    args = parse_args()
    if answered_as_worker(args, measure):
        return
    depths = sorted(args.depths)
    switches = [s for s in SWITCHES if s in args.switches]
    results = []
    for switch in switches:
        for depth in depths:
            results.append(run_worker(args, switch, depth))
            print(f"{switch:>14} depth {depth:>2}: {json.dumps(results[-1])}", flush=True)
    key = memory_key(args.device)
    summary = summarise(results, key, depths, switches)
    goal = summary["both"]["memory_ratio"] <= GOAL_RATIO if "both" in summary else None
    print(table(results, key, depths, summary, switches))
    if goal is not None:
        print(
            f"goal (both switches, depth {depths[-1]} <= {GOAL_RATIO}x depth {depths[0]}): "
            f"{'met' if goal else 'NOT met'}"
        )
    name = (
        "training_memory"
        + ("" if args.device == "cpu" else "_cuda")
        + ("" if args.dtype == "fp32" else f"_{args.dtype}")
    )
    payload = {
        "benchmark": "peak training memory against BPTT depth",
        "model": {k: getattr(args, k) for k in MODEL_ARGS if k not in ("threads", "repeats")}
        | {"method": "hmt", "sensory_length": 32, "memory_window": 16},
        "memory_metric": key,
        "results": results,
        "summary": summary,
        "goal": {"both_memory_ratio_max": GOAL_RATIO, "met": goal},
        "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
    }
    write_result(name, payload)
    plot(results, key, depths, os.path.join(RESULTS, f"{name}.png"), switches)


if __name__ == "__main__":
    main()
