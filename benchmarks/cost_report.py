"""What every memory method costs against the bare backbone, one table per measure, rendered into docs/cost.md.

    python benchmarks/cost_report.py                       # CPU: the 4-layer width-256 Llama, fp32, one thread
    python benchmarks/cost_report.py --device cuda         # GPU: bf16, batch 8, SmolLM2-135M and a 1B-class config
    python benchmarks/cost_report.py --parts speed decode --methods trams unimix   # re-measure some rows

Every part writes its rows into `benchmarks/results/cost_report_<device>.json` (re-measured rows replace theirs,
each part keeps its command, commit and machine) and docs/cost.md is rendered from the CPU and CUDA files.

Definitions, the same for every row:
- **bare**: the same wrapped model with memory disabled (`MemoryModel.disable_memory()`): the backbone on each
  segment alone through the same runtime. Every row, bare included, computes the loss on every token
  (`labels=ids`), so the LM head runs on every token of every row.
- **FLOPs**: `torch.utils.flop_counter` on an eager-attention copy of the same model over the same input (every
  matmul; attention as eager computes it, the whole query x key rectangle, masked pairs included). A fused causal
  kernel skips the masked half of the bare segment's attention, which an explicit memory mask cannot do.
- **speed x FLOPs**: (tokens/s over bare's) x (FLOPs over bare's), i.e. the FLOP rate relative to bare's: 1.0 is the
  speed the arithmetic predicts; below 1.0, work the FLOP count does not see (top-k, gathers, masks) or slower kernels.
- **selection share**: the share of a forward's time spent choosing each query's top-k entries
  (`reading.top_entries`: the Memorizing Transformer's and UniMix' reads), timed in one forward of its own after the
  rounds; `speed x FLOPs / (1 - share)` is what the row would read if that choice cost nothing.
- **peak memory**: CPU: the peak RSS one forward adds to the built model (a fresh process per row); CUDA:
  `torch.cuda.max_memory_allocated` during one forward minus what was allocated before it (one process, the rows
  one after another, the cache emptied between them). Plus the memory state.
- **per-segment time vs length**: a `step` stream (batch 1), rows interleaved segment by segment; the median of the
  8 segments that end at each length.
- **decode**: tokens/s of `generate` after a prompt of 7.5 segments, one segment's worth of new tokens (so one fold
  into memory per run; the prefill cancels out: time(n + 1 tokens) - time(1 token)), against the bare backbone's
  `generate` inside one window (a 1-token prompt, the same number of new tokens).
Times are CPU time of the process on CPU (one torch thread; other jobs on a shared machine inflate wall-clock time,
not this), wall-clock between synchronisations on CUDA. Ratios are medians of interleaved rounds in one process (all
rows see the same machine state); `spread` is the lowest and highest per-round ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

import hmt_adapters as ha  # noqa: E402
from common import RESULTS, ROOT, counted_flops, in_fresh_process, interleaved, provenance  # noqa: E402
from hmt_adapters.methods.unimem import reading  # noqa: E402

DOC = ROOT / "docs" / "cost.md"
PARTS = ("speed", "memory", "length", "decode")
GREEDY = dict(do_sample=False, pad_token_id=0)  # decode: every row generates the same way
# name -> LlamaConfig fields (random weights: cost does not depend on them)
MODELS = {
    "llama4": dict(
        vocab_size=8192,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
    ),
    # SmolLM2-135M's shape (hmt_adapters.backbones.smollm2 loads the real weights; the shape is what costs)
    "smollm2": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        rope_theta=100000.0,
    ),
    # a 1B-class config (TinyLlama-1.1B's shape)
    "llama1b": dict(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
    ),
}
LABEL = {
    "llama4": "4-layer width-256 Llama (8 query / 4 KV heads)",
    "smollm2": "SmolLM2-135M shape",
    "llama1b": "1B-class Llama (TinyLlama-1.1B shape)",
}
# device -> what each part measures: (model, segment length, batch, segments)
SETUPS = {
    "cpu": {
        "dtype": torch.float32,
        "speed": [("llama4", 128, 2, 16), ("llama4", 512, 1, 16)],
        "memory": [("llama4", 128, 2, 16)],
        "length": ("llama4", 512, 1),
        "decode": ("llama4", 256, (1, 8)),
    },
    "cuda": {
        "dtype": torch.bfloat16,
        "speed": [("smollm2", 512, 8, 16), ("llama1b", 512, 8, 16)],
        "memory": [("smollm2", 512, 8, 16), ("llama1b", 512, 8, 16)],
        "length": ("smollm2", 512, 1),
        "decode": ("smollm2", 512, (1, 8)),
    },
}


# ---- building and timing ------------------------------------------------------------------------------------------


def backbone(model: str, device: str, attn: str = "sdpa") -> torch.nn.Module:
    config = LlamaConfig(max_position_embeddings=4096, **MODELS[model])
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs: a 1B-class model's CPU init takes seconds per copy
        net = AutoModelForCausalLM.from_config(config, attn_implementation=attn)
    return net.to(dtype=SETUPS[device]["dtype"]).eval()


def wrapped(method: str, model: str, segment: int, device: str, attn: str = "sdpa") -> ha.MemoryModel:
    return ha.wrap_with_memory(backbone(model, device, attn), method, segment_length=segment).eval()


def document(batch: int, length: int, vocab: int, device: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def seconds(fn: Callable[[], object], device: str) -> float:
    """Time of `fn()`: on CUDA wall-clock between synchronisations; on CPU the process's CPU time (one torch thread),
    which other jobs on a shared machine do not inflate by preempting it, as they do wall-clock time."""
    if device != "cpu":
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        return time.perf_counter() - start
    start = time.process_time()
    fn()
    return time.process_time() - start


def forward(model: ha.MemoryModel, ids: torch.Tensor, memory: bool) -> None:
    """One evaluation forward with the loss on every token; `memory=False` is bare."""
    with torch.no_grad():
        if memory:
            model(input_ids=ids, labels=ids)
        else:
            with model.disable_memory():
                model(input_ids=ids, labels=ids)


def selection_share(model: ha.MemoryModel, ids: torch.Tensor, device: str) -> float:
    """The share of one forward's time (`seconds`) spent in the per-query top-k selection (`reading.top_entries`,
    which the FLOP count does not see), in a forward of its own: the timed rounds run without this timer."""
    select, spent, open_calls = reading.top_entries, [], []

    def timed(scores: torch.Tensor, k: int, group: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
        if open_calls:  # the selection's own recursion (it calls the module-level name): inside its caller's time
            return select(scores, k, group)
        open_calls.append(True)
        found = []
        spent.append(seconds(lambda: found.append(select(scores, k, group)), device))
        open_calls.pop()
        return found[0]

    reading.top_entries = timed  # the module-level name `top_candidates` calls
    try:
        total = seconds(lambda: forward(model, ids, True), device)
    finally:
        reading.top_entries = select
    return sum(spent) / total


def summary(times: dict[str, list[float]], per: float) -> dict[str, dict]:
    """Median rate (`per` / seconds) of each row and its per-round ratio to bare (median, lowest, highest)."""
    out = {}
    for name, ts in times.items():
        ratios = [b / t for b, t in zip(times["bare"], ts)]
        out[name] = {
            "rate": per / statistics.median(ts),
            "vs_bare": statistics.median(ratios),
            "spread": [min(ratios), max(ratios)],
            "seconds": ts,
        }
    return out


# ---- the measures -------------------------------------------------------------------------------------------------


def speed(methods: list[str], device: str, rounds: int) -> dict:
    """Tokens/s and FLOPs of every method against bare, per (model, segment) setup."""
    out = {}
    for model, segment, batch, segments in SETUPS[device]["speed"]:
        ids = document(batch, segment * segments, MODELS[model]["vocab_size"], device)
        models = {m: wrapped(m, model, segment, device) for m in methods}
        first = models[methods[0]]
        # the timed lambdas all run inside this iteration (interleaved below), before `del models`
        runs = {"bare": lambda: seconds(lambda: forward(first, ids, False), device)}  # noqa: B023
        runs.update({m: (lambda m=m: seconds(lambda: forward(models[m], ids, True), device)) for m in methods})  # noqa: B023, F821
        rows = summary(interleaved(runs, rounds), ids.numel())
        rows["bare"]["selection_share"] = 0.0
        for m in methods:
            rows[m]["selection_share"] = selection_share(models[m], ids, device)
        del models
        flops = {}
        for name in ["bare", *methods]:
            eager = wrapped(methods[0] if name == "bare" else name, model, segment, device, attn="eager")
            flops[name] = counted_flops(lambda: forward(eager, ids, name != "bare"))  # noqa: B023 (called here)
        for name, row in rows.items():
            row["flops_vs_bare"] = flops[name]["total"] / flops["bare"]["total"]
            row["attention_flops_vs_bare"] = flops[name]["attention"] / flops["bare"]["attention"]
            row["speed_x_flops"] = row["vs_bare"] * row["flops_vs_bare"]
        out[f"{model}/{segment}"] = {
            "model": model,
            "segment": segment,
            "batch": batch,
            "segments": segments,
            "rounds": rounds,
            "rows": rows,
        }
    return out


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as fh:
        return int(next(line for line in fh if line.startswith(field + ":")).split()[1]) * 1024


def peak_worker(spec: str) -> dict:
    """One forward in this (fresh) process: peak memory it adds to the built model, and the state's bytes."""
    method, model, segment, batch, segments, device = json.loads(spec)
    torch.set_num_threads(1)
    net = wrapped(method if method != "bare" else "rmt", model, segment, device)
    ids = document(batch, segment * segments, MODELS[model]["vocab_size"], device)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")  # reset the peak RSS to the current RSS: building the model does not count
        before = _status_bytes("VmRSS")
    forward(net, ids, method != "bare")
    peak = torch.cuda.max_memory_allocated() if device == "cuda" else _status_bytes("VmHWM")
    state = 0
    if method != "bare":
        with torch.no_grad():
            _, st = net.step(ids[:, :segment])
        state = sum(t.numel() * t.element_size() for t in st.tensors.values())
    return {"peak_extra_mb": (peak - before) / 2**20, "state_mb": state / 2**20}


def memory(methods: list[str], device: str, rounds: int) -> dict:
    out = {}
    for model, segment, batch, segments in SETUPS[device]["memory"]:
        rows = {}
        for name in ["bare", *methods]:
            spec = json.dumps([name, model, segment, batch, segments, device])
            if device == "cuda":  # the allocator counts this forward's tensors alone: one process serves every row
                gc.collect()
                torch.cuda.empty_cache()
                rows[name] = peak_worker(spec)
            else:  # the peak RSS of a process: a fresh one per row
                rows[name] = in_fresh_process(__file__, "--peak-worker", spec)
        out[f"{model}/{segment}"] = {
            "model": model,
            "segment": segment,
            "batch": batch,
            "segments": segments,
            "rows": rows,
        }
    return out


def length(methods: list[str], device: str, rounds: int, lengths: list[int]) -> dict:
    """Per-segment time of a `step` stream at each length, rows interleaved segment by segment."""
    model, segment, batch = SETUPS[device]["length"]
    models = {m: wrapped(m, model, segment, device) for m in methods}
    first = models[methods[0]]
    states: dict[str, ha.MemoryState | None] = {m: None for m in methods}
    times: dict[str, list[float]] = {name: [] for name in ["bare", *methods]}
    vocab = MODELS[model]["vocab_size"]

    def step(name: str, ids: torch.Tensor) -> None:
        with torch.no_grad():
            if name == "bare":
                with first.disable_memory():
                    first.step(ids)
            else:
                states[name] = models[name].step(ids, states[name])[1]

    order = list(times)
    for n in range(max(lengths) // segment):
        ids = document(batch, segment, vocab, device, seed=n)
        for name in order if n % 2 == 0 else reversed(order):
            times[name].append(seconds(lambda: step(name, ids), device))  # noqa: B023 (called here)
    window = 8
    rows = {}
    for name, ts in times.items():
        at = {str(n): statistics.median(ts[max(0, n // segment - window) : n // segment]) for n in lengths}
        rows[name] = {
            "ms": {k: v * 1e3 for k, v in at.items()},
            "last_over_first": at[str(lengths[-1])] / at[str(lengths[0])],
        }
    return {"model": model, "segment": segment, "batch": batch, "lengths": lengths, "window": window, "rows": rows}


def decode(methods: list[str], device: str, rounds: int, setup: tuple | None = None) -> dict:
    model, segment, batches = setup or SETUPS[device]["decode"]
    vocab = MODELS[model]["vocab_size"]
    out = {
        "model": model,
        "segment": segment,
        "prompt": 8 * segment - segment // 2,
        "new_tokens": segment,
        "rounds": rounds,
        "batches": {},
    }
    bare = backbone(model, device)
    nets = {m: wrapped(m, model, segment, device) for m in methods}
    eager = {"bare": backbone(model, device, "eager")}  # the FLOP counts' copies (`counted_flops`)
    eager.update({m: wrapped(m, model, segment, device, "eager") for m in methods})
    for batch in batches:

        def rate(net, ids) -> Callable[[], float]:
            def timed(new: int) -> float:
                return seconds(generating(net, ids, new), device)

            return lambda: timed(segment + 1) - timed(1)

        prompt = document(batch, out["prompt"], vocab, device)
        bare_prompt = document(batch, 1, vocab, device)
        runs = {"bare": rate(bare, bare_prompt)}
        runs.update({m: rate(nets[m], prompt) for m in methods})
        rows = summary(interleaved(runs, rounds), segment * batch)
        prompts = {name: bare_prompt if name == "bare" else prompt for name in eager}
        flops = {name: decode_flops(net, prompts[name], segment) for name, net in eager.items()}
        for name, row in rows.items():
            row["flops_vs_bare"] = flops[name] / flops["bare"]
            row["speed_x_flops"] = row["vs_bare"] * row["flops_vs_bare"]
        out["batches"][str(batch)] = rows
    return out


def generating(net: torch.nn.Module, prompt: torch.Tensor, tokens: int) -> Callable[[], object]:
    """`net.generate` of exactly `tokens` new tokens after `prompt`, as every decode row runs it (timed, counted)."""
    return lambda: net.generate(input_ids=prompt, max_new_tokens=tokens, min_new_tokens=tokens, **GREEDY)


def decode_flops(net: torch.nn.Module, prompt: torch.Tensor, new: int) -> int:
    """FLOPs of `new` decoded tokens after `prompt` (eager attention; the prefill cancels out as in the timing)."""
    decoded, prefill = (counted_flops(generating(net, prompt, n))["total"] for n in (new + 1, 1))
    return decoded - prefill


# ---- rendering ----------------------------------------------------------------------------------------------------


def _header(part: dict, command: str) -> str:
    prov = part["provenance"]
    return (
        f"`{command}` (commit `{(prov.get('git_commit') or '?')[:10]}`, {prov['device']}, {prov['machine']}, "
        f"torch {prov['torch']}, {prov['time']})"
    )


def _label(name: str, row: dict) -> str:
    """A row's name, with the commit and date it was measured at when that is not the table's (a kept row)."""
    return f"`{name}` (measured {row['measured']})" if "measured" in row else f"`{name}`"


def _spread(row: dict) -> str:
    return f"{row['spread'][0]:.2f}-{row['spread'][1]:.2f}"


def _selection_cells(row: dict) -> str:
    """A speed row's selection share and its speed x FLOPs without the selection (`-` for rows measured before the
    share was)."""
    if "selection_share" not in row:
        return "- | -"
    share = row["selection_share"]
    return f"{share:.2f} | {row['speed_x_flops'] / (1 - share):.2f}"


def _decode_cells(row: dict) -> str:
    """A decode row's cells for one batch size (rows measured before decode FLOPs were counted show `-` there)."""
    counted = [f"{row[k]:.2f}" if k in row else "-" for k in ("flops_vs_bare", "speed_x_flops")]
    return " | ".join([f"{row['rate']:,.1f}", f"{row['vs_bare']:.2f} ({_spread(row)})", *counted])


def render(results: dict[str, dict]) -> str:
    lines = [
        "Rendered by `python benchmarks/cost_report.py` from `benchmarks/results/cost_report_<device>.json`; the",
        "definitions of bare, FLOPs and times are at the top of this page and in the script's docstring.",
        "",
    ]
    for device, data in results.items():
        setup = data.get("setup", {})
        lines += [f"## {device.upper()}: {setup.get('note', '')}", ""]
        if "speed" in data:
            for run in data["speed"]["results"].values():
                lines += [
                    f"### Speed and FLOPs vs bare: {LABEL[run['model']]}, batch {run['batch']} x "
                    f"{run['segments']} segments of {run['segment']}",
                    "",
                    _header(data["speed"], data["speed"]["command"]) + f", {run['rounds']} rounds",
                    "",
                    "| method | tokens/s | speed x bare (spread) | FLOPs x bare | attention FLOPs x bare | "
                    "speed x FLOPs | top-k selection share | speed x FLOPs, selection free |",
                    "|---|---|---|---|---|---|---|---|",
                ]
                for name, r in run["rows"].items():
                    lines.append(
                        f"| {_label(name, r)} | {r['rate']:,.0f} | {r['vs_bare']:.2f} ({_spread(r)}) | "
                        f"{r['flops_vs_bare']:.2f} | {r['attention_flops_vs_bare']:.2f} | "
                        f"{r['speed_x_flops']:.2f} | {_selection_cells(r)} |"
                    )
                lines.append("")
        if "memory" in data:
            for run in data["memory"]["results"].values():
                lines += [
                    f"### Peak memory: {LABEL[run['model']]}, batch {run['batch']} x {run['segments']} segments "
                    f"of {run['segment']}",
                    "",
                    _header(data["memory"], data["memory"]["command"]),
                    "",
                    "| method | peak MB added by one forward | x bare | memory state MB |",
                    "|---|---|---|---|",
                ]
                bare = run["rows"]["bare"]["peak_extra_mb"]
                for name, r in run["rows"].items():
                    lines.append(
                        f"| {_label(name, r)} | {r['peak_extra_mb']:.1f} | {r['peak_extra_mb'] / bare:.2f} | "
                        f"{r['state_mb']:.2f} |"
                    )
                lines.append("")
        if "length" in data:
            run = data["length"]["results"]
            heads = " | ".join(f"{n // 1024}k" for n in run["lengths"])
            lines += [
                f"### Per-segment time vs document length: {LABEL[run['model']]}, `step` stream, batch "
                f"{run['batch']}, segments of {run['segment']}",
                "",
                _header(data["length"], data["length"]["command"]) + f"; median of the {run['window']} "
                "segments ending at each length (ms)",
                "",
                f"| method | {heads} | {run['lengths'][-1] // 1024}k / {run['lengths'][0] // 1024}k |",
                "|---|" + "---|" * (len(run["lengths"]) + 1),
            ]
            for name, r in run["rows"].items():
                cells = " | ".join(f"{r['ms'][str(n)]:.1f}" for n in run["lengths"])
                lines.append(f"| {_label(name, r)} | {cells} | {r['last_over_first']:.2f} |")
            lines.append("")
        for part in [k for k in data if k.startswith("decode")]:
            run = data[part]["results"]
            batches = list(run["batches"])
            lines += [
                f"### Decode: {LABEL[run['model']]}, segments of {run['segment']}, {run['new_tokens']} new "
                f"tokens after a {run['prompt']}-token prompt",
                "",
                _header(data[part], data[part]["command"]) + f", {run['rounds']} rounds",
                "",
                "| method | "
                + " | ".join(f"batch {b}: tokens/s | x bare (spread) | FLOPs x bare | speed x FLOPs" for b in batches)
                + " |",
                "|---|" + "---|---|---|---|" * len(batches),
            ]
            names = list(run["batches"][batches[0]])
            for name in names:
                cells = " | ".join(_decode_cells(run["batches"][b][name]) for b in batches)
                lines.append(f"| {_label(name, run['batches'][batches[0]][name])} | {cells} |")
            lines.append("")
    return "\n".join(lines)


START, END = "<!-- cost-report:start -->", "<!-- cost-report:end -->"


def keep_rows(result: dict, old: dict, measured: str) -> None:
    """Rows of methods not re-measured keep their earlier numbers, in every table of a part whose setup (model,
    segment, lengths, batch...) is unchanged: `--methods` re-measures some rows without losing the others. A kept
    row says when it was measured (`measured`: the old part's commit and date, unless the row already says)."""

    def setup(run: dict) -> dict:
        return {k: v for k, v in run.items() if k not in ("rows", "batches", "rounds")}

    def tables(part: dict) -> dict[str, tuple[dict, dict]]:  # table -> (its setup, its rows), in each part's layout
        if "rows" in part:  # length: one table
            return {"": (setup(part), part["rows"])}
        if "batches" in part:  # decode: a table per batch size
            return {b: (setup(part), rows) for b, rows in part["batches"].items()}
        return {key: (setup(run), run["rows"]) for key, run in part.items()}  # speed, memory: per (model, segment)

    before = tables(old) if old else {}
    for key, (kind, rows) in tables(result).items():
        if key in before and before[key][0] == kind:
            rows.update({n: {"measured": measured, **r} for n, r in before[key][1].items() if n not in rows})


def write_doc(tables: str) -> None:
    """The tables between the markers of docs/cost.md (the prose around them is written by hand); a new page holds
    only the tables."""
    text = DOC.read_text() if DOC.is_file() else f"{START}\n{END}\n"
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{START}\n{tables}\n{END}{tail}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=list(SETUPS))
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    parser.add_argument("--methods", nargs="+", default=ha.available_methods())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lengths", nargs="+", type=int, default=[8192, 32768, 131072])
    parser.add_argument(
        "--decode-setup",
        nargs="+",
        metavar="MODEL SEGMENT BATCH",
        help="decode on another model (name in MODELS), segment length and batches; its own table",
    )
    parser.add_argument("--render-only", action="store_true", help="only re-render docs/cost.md")
    parser.add_argument("--peak-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_worker:
        print(json.dumps(peak_worker(args.peak_worker)))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is visible to torch.")
    torch.set_num_threads(1)  # 2 shared cores: more threads oversubscribe; on CUDA the host thread only launches
    path = RESULTS / f"cost_report_{args.device}.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data["setup"] = {
        "note": "fp32, one CPU thread" if args.device == "cpu" else "bf16",
        **{k: v for k, v in SETUPS[args.device].items() if k != "dtype"},
    }
    command = "python benchmarks/cost_report.py" + ("" if args.device == "cpu" else f" --device {args.device}")
    measures = {
        "speed": lambda: speed(args.methods, args.device, args.rounds),
        "memory": lambda: memory(args.methods, args.device, args.rounds),
        "length": lambda: length(args.methods, args.device, args.rounds, args.lengths),
        "decode": lambda: decode(args.methods, args.device, max(1, args.rounds - 2), setup),
    }
    setup = None
    if args.decode_setup:
        name, seg, *batches = args.decode_setup
        setup = (name, int(seg), tuple(int(b) for b in batches))
    for part in [] if args.render_only else args.parts:
        started = time.perf_counter()
        result = measures[part]()
        if part == "decode" and setup:
            part = f"decode_{setup[0]}"
        if part in data:
            prov = data[part]["provenance"]
            keep_rows(result, data[part]["results"], f"{(prov.get('git_commit') or '?')[:10]}, {prov['time'][:10]}")
        flags = f" --decode-setup {' '.join(args.decode_setup)}" if part.startswith("decode_") else ""
        methods = "" if args.methods == ha.available_methods() else f" --methods {' '.join(args.methods)}"
        data[part] = {
            "command": f"{command} --parts {part.split('_')[0]}{flags}{methods} --rounds {args.rounds}",
            "provenance": provenance(),
            "results": result,
            "seconds": round(time.perf_counter() - started, 1),
        }
        path.write_text(json.dumps(data, indent=1) + "\n")
        print(f"{part}: {data[part]['seconds']} s", flush=True)
    results = {}
    for device in SETUPS:
        file = RESULTS / f"cost_report_{device}.json"
        if file.is_file():
            results[device] = json.loads(file.read_text())
    write_doc(render(results))
    print(f"wrote {path} and {DOC}")


if __name__ == "__main__":
    main()
