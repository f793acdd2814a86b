"""Long-range recall for every method: a tiny Llama trained from scratch with each memory, same task and budget
(docs/benchmarks.md).

`hmt_adapters.tasks.RecallTask`: a 4-digit key in the first 8-token segment, `gap` noise segments, then a query; a
curriculum (`--gaps`) moves the gap 0 -> 1 -> 2 -> 4 -> 8 when exact accuracy reaches 95% (at most `--max-steps`
steps). The baseline `window` is the same backbone trained the same way with no memory (`rmt` with 0 memory tokens:
each segment alone); `full_attention` is the bare backbone over the whole sample. Each trained model is evaluated
after 8 and 16 noise segments (10 and 18 segments in all). K/V methods use their presets at this segment length, so
their fixed memory may not reach 17 segments back; that is what they are. The presets store keys/values without
gradient (their papers' stop-gradient); the `_bptt` rows and `transformer_xl_document` train through them
(`detach_memory=False`, docs/attention_memory.md). Each row also records `recall_probe`'s numbers at 10 segments (what
the memory stores, reads and attends of the key; whether the answer's loss reaches the key segment).

    python benchmarks/recall.py [--methods hmt rmt ...] [--max-steps 3000] [--gaps 0 1 2 4 8] [--name recall]
        [--update] [--threads 2] [--probe-untrained]

Writes `benchmarks/results/<name>.json` and `.png`; `--update` keeps the file's other rows and replaces the ones run.
`--probe-untrained` only probes the freshly built models (`<name>_probe_untrained.json`). A longer curriculum for the
methods that pass 8, e.g. `--methods rmt hmt --gaps 0 1 2 4 8 16 --max-steps 4000 --name recall_gap16`, is rendered
in the same README table; `--methods transformer_xl_document_detached --max-steps 1000 --name recall_stop_gradient`
is the stop-gradient run of docs/attention_memory.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import previous_runs, pyplot, write_result  # noqa: E402
from hmt_adapters.methods.elastic import ElasticMemory  # noqa: E402
from hmt_adapters.methods.unimem import UniMem  # noqa: E402
from hmt_adapters.tasks import RecallTask, train_recall  # noqa: E402
from recall_probe import key_gradient, probe_elastic, probe_unimem  # noqa: E402

SEGMENT = 8
# method -> overrides for an 8-token segment and a width-128 model (everything else: the method's defaults)
RUNS = {
    "window": ("rmt", {"num_memory_tokens": 0}),
    "rmt": ("rmt", {"num_memory_tokens": 4}),
    "hmt": ("hmt", {"sensory_length": 0, "memory_window": 16}),
    "transformer_xl": ("transformer_xl", {}),
    "trams": ("trams", {}),
    "memorizing_transformer": ("memorizing_transformer", {}),
    "unimix": ("unimix", {"memory_tokens": 4}),
    "elastic": ("elastic", {"hippo_order": 64}),  # the method's default readout: memory_tokens = hippo_order
    "melodi": ("melodi", {}),
    # the reference and each K/V method with gradients through its stored keys/values (BPTT)
    "full_attention": (None, {}),
    "transformer_xl_document": ("transformer_xl", {"memory_size": 17 * SEGMENT, "detach_memory": False}),
    "transformer_xl_document_detached": ("transformer_xl", {"memory_size": 17 * SEGMENT}),
    "trams_bptt": ("trams", {"memory_size": 10 * SEGMENT, "detach_memory": False}),
    "memorizing_transformer_bptt": ("memorizing_transformer", {"detach_memory": False}),
    "unimix_bptt": ("unimix", {"memory_tokens": 4, "detach_memory": False}),
    "elastic_16_tokens": ("elastic", {"hippo_order": 64, "memory_tokens": 16}),  # 16 samples of 72+ tokens
}
EVAL_GAPS = (8, 16)


def model_for(name: str, task: RecallTask, seed: int = 0) -> torch.nn.Module:
    """The run's model; `full_attention` is the bare backbone reading the whole sample at once."""
    method, overrides = RUNS[name]
    config = LlamaConfig(
        vocab_size=task.vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(config)
    if method is None:
        return base
    return ha.wrap_with_memory(base, method, segment_length=SEGMENT, freeze_backbone=False, **overrides)


def run(names: list[str], max_steps: int, gaps: tuple[int, ...] = (0, 1, 2, 4, 8)) -> dict:
    task = RecallTask(segment_length=SEGMENT, num_digits=4, vocab_size=64)
    results = {}
    for name in names:
        model = model_for(name, task)
        start = time.time()
        history = train_recall(model, task, gaps=gaps, max_steps=max_steps)
        row = {
            "method": RUNS[name][0],
            "overrides": RUNS[name][1],
            "steps": history[-1]["step"],
            "last_gap_trained": history[-1]["gap"],
            "train_seconds": time.time() - start,
            "history": history,
        }
        for gap in EVAL_GAPS:
            digit, exact = task.accuracy(model, gap)
            row[f"gap{gap}"] = {"segments": gap + 2, "digit": digit, "exact": exact}
        row["probe"] = probe(model, task)
        results[name] = row
        print(
            f"{name:24} steps {row['steps']:5d} (gap {row['last_gap_trained']}) "
            + "  ".join(f"{g + 2} segments: exact {row[f'gap{g}']['exact']:.3f}" for g in EVAL_GAPS),
            flush=True,
        )
    return {
        "task": "recall",
        "segment_length": SEGMENT,
        "digits": 4,
        "chance": {"digit": 0.1, "exact": 1e-4},
        "backbone": "Llama, 2 layers, width 128, 4 heads, vocabulary 64, trained from scratch",
        "curriculum": list(gaps),
        "max_steps": max_steps,
        "runs": results,
    }


def probe(model: torch.nn.Module, task: RecallTask, gap: int = EVAL_GAPS[0]) -> dict:
    """What the model does with the key after `gap` noise segments: whether the answer's loss reaches the key segment
    (`key_gradient`) and, for K/V and Elastic memories, per layer how much of the key is stored, read and attended."""
    out = {"gap": gap, "key_gradient": key_gradient(model, task, gap)}
    memory = getattr(model, "memory", None)
    probed = {UniMem: probe_unimem, ElasticMemory: probe_elastic}.get(type(memory))
    if probed is not None:
        out["layers"] = {str(layer): numbers for layer, numbers in probed(model, task, gap).items()}
    return out


def probe_untrained(names: list[str], gaps: tuple[int, ...] = (0, 1, 8)) -> dict:
    """The probe of each run's freshly initialised model: what its sizes and stop-gradient allow before training
    (stored, read, key gradient do not depend on the weights; the mass is near uniform)."""
    task = RecallTask(segment_length=SEGMENT, num_digits=4, vocab_size=64)
    runs = {}
    for name in names:
        model = model_for(name, task)
        runs[name] = {
            "method": RUNS[name][0],
            "overrides": RUNS[name][1],
            **{f"gap{gap}": probe(model, task, gap) for gap in gaps},
        }
        print(name, {g: runs[name][f"gap{g}"] for g in gaps}, flush=True)
    return {"task": "recall probe, untrained models", "segment_length": SEGMENT, "runs": runs}


def merge(name: str, result: dict) -> dict:
    """`result` with the runs of `benchmarks/results/<name>.json` it did not redo (each row keeps its commit)."""
    keys = ("segment_length", "digits", "curriculum", "max_steps")
    old = previous_runs(name, lambda data: {k: data.get(k) for k in keys}, {k: result[k] for k in keys})
    return {**result, "runs": {**old, **result["runs"]}}


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    names = list(result["runs"])
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.38
    for i, gap in enumerate(EVAL_GAPS):
        ax.bar(
            [x + i * width for x in range(len(names))],
            [result["runs"][n][f"gap{gap}"]["exact"] for n in names],
            width,
            label=f"{gap + 2} segments",
        )
    ax.set_xticks([x + width / 2 for x in range(len(names))], names, rotation=30, ha="right")
    ax.set(ylabel="exact-key accuracy", ylim=(0, 1.25), title="Recall a 4-digit key from segment 1")
    ax.legend(loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = [name for name in RUNS if name != "transformer_xl_document_detached"]  # its own file, 1000 steps
    parser.add_argument("--methods", nargs="+", default=default, choices=list(RUNS))
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--gaps", nargs="+", type=int, default=[0, 1, 2, 4, 8], help="the curriculum of gaps")
    parser.add_argument("--name", default="recall", help="results file name in benchmarks/results/")
    parser.add_argument("--update", action="store_true", help="keep the file's other runs, replace these")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--probe-untrained",
        action="store_true",
        help="only probe the untrained models; writes <name>_probe_untrained.json",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.probe_untrained:
        write_result(f"{args.name}_probe_untrained", probe_untrained(args.methods))
        return
    result = run(args.methods, args.max_steps, tuple(args.gaps))
    if args.update:
        result = merge(args.name, result)
    path = write_result(args.name, result)
    plot(result, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
