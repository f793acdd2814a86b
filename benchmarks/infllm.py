"""Training-free block retrieval (`"infllm"`, docs/infllm.md) against the bare backbone, one JSON line per sample.

Every sample is keyed by (reader, task, haystack, length, depth, seed) in `--out` (JSONL): `--update` adds the
samples not yet there and never repeats one, so a cell grows across runs; `--table` prints the tables (accuracy,
sample count, 95% Wilson interval). Sample i of a cell has seed `--seed + i` and depth `depths[i % len(depths)]`
(with `--seeds`, seed s has depth `depths[(s - --seed) % len(depths)]`, as it has in a `--samples` run).

Readers:
- `backbone`: the bare backbone on the last `--context` tokens (its trained context; at lengths up to it this is
  full attention over the whole prompt: the in-context baseline);
- `yarn`: the bare backbone with transformers' YaRN RoPE scaling (`rope_parameters` `rope_type="yarn"`, factor = the
  prompt's length / `--context`, the trained context as `original_max_position_embeddings`) reading the whole prompt
  with full attention: what a user would try first to read past the trained context;
- `llama_cpp`, `llama_cpp_yarn`: llama.cpp on the GGUF file the backbone comes from (`--model smollm2` only; needs
  llama-cpp-python, see `benchmarks/llama_cpp_peer.py`), full attention over the same token ids, without and with
  llama.cpp's YaRN scaled from `--context` to the prompt's length;
- `infllm`: the bare backbone wrapped with `wrap_with_memory(base, "infllm", **--infllm-fields)` (no training);
  each record also holds, per layer, whether every needle's block was among the blocks retrieved at the question
  (recall@k, `recall`), and the number of blocks in memory.

    python benchmarks/infllm.py --readers infllm --tasks niah_single_noise passkey_standard --lengths 8k 16k 32k \
        --samples 25 --update --threads 1
    python benchmarks/infllm.py --table
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import parse_field, provenance  # noqa: E402
from hmt_adapters.evaluation import TASKS, Reader, retrieval_recall, score  # noqa: E402
from hmt_adapters.evaluation.harness import load_backbone  # noqa: E402
from hmt_adapters.evaluation.records import append_record, load_records, markdown_tables, record_key  # noqa: E402
from hmt_adapters.evaluation.shared_prefix import Checkpoints, SharedPrefixes  # noqa: E402
from hmt_adapters.evaluation.tasks import SINGLE_NEEDLE_TASKS  # noqa: E402
from llama_cpp_peer import READERS as LLAMA_CPP_READERS  # noqa: E402
from llama_cpp_peer import llama_cpp_config, llama_cpp_reader  # noqa: E402
from longcontext import parse_length  # noqa: E402

READERS = ("backbone", "yarn", *LLAMA_CPP_READERS, "infllm")
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)  # `--depths`: sample i of a cell has depth DEPTHS[i % 5]
DEFAULT_OUT = "benchmarks/results/infllm.jsonl"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="'smollm2' (offline SmolLM2-135M) or a causal LM path")
    p.add_argument("--readers", nargs="+", default=["infllm"], choices=READERS)
    p.add_argument("--tasks", nargs="+", default=["niah_single_noise", "passkey_standard"], choices=sorted(TASKS))
    p.add_argument("--lengths", nargs="+", type=parse_length, default=[8192])
    p.add_argument("--samples", type=int, default=5, help="samples per (reader, task, length) cell")
    p.add_argument("--depths", nargs="+", type=float, default=list(DEPTHS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=None,
        help="these seeds instead of --seed .. --seed + --samples - 1 (seed s: depths[(s - --seed) %% len(depths)])",
    )
    p.add_argument("--haystack", default=None, help="haystack for every task (default: each task's own)")
    p.add_argument("--context", type=int, default=None, help="the backbone reader's context (default: its config's)")
    p.add_argument(
        "--infllm-fields",
        nargs="*",
        type=parse_field,
        default=[],
        metavar="NAME=VALUE",
        help="fields of the infllm configuration, e.g. window=2048 store_dtype=bfloat16",
    )
    p.add_argument("--reader-name", default=None, help="record the infllm reader under this name (a variant)")
    p.add_argument("--out", default=DEFAULT_OUT, help="JSONL results file")
    p.add_argument("--update", action="store_true", help="add the missing samples to an existing --out")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--device", default="cpu", help="torch device of the model and the memory store, e.g. cuda")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the backbone's weights")
    p.add_argument(
        "--no-shared-prefix",
        action="store_true",
        help="read every prompt from its beginning (default: samples sharing a haystack beginning read it "
        "once; the answers are the same, tests/test_infllm.py)",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="save each memory reader's prompt state here every --checkpoint-every tokens, and continue a sample "
        "from its checkpoint when a run was stopped mid-prompt (a 1M-token prompt is hours of a CPU)",
    )
    p.add_argument("--checkpoint-every", type=int, default=65536, help="tokens between checkpoints (whole segments)")
    p.add_argument("--table", action="store_true", help="print the tables of --out and exit")
    return p


def yarn_backbone(base: torch.nn.Module, length: int, context: int) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A copy of `base` whose RoPE is transformers' YaRN (`rope_type="yarn"`) scaled from its trained `context` to
    `length` tokens (factor `length / context`, at least 1), and the `rope_parameters` it runs with: the copy's
    config carries them, and every rotary embedding module is rebuilt from that config, as `from_pretrained` with
    those `rope_parameters` builds it."""
    model = copy.deepcopy(base)
    config = model.config
    factor = max(1.0, length / context)
    config.rope_parameters = {
        **config.rope_parameters,
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": context,
    }
    config.max_position_embeddings = max(context, length)
    device = next(base.parameters()).device
    for name, module in list(model.named_modules()):
        if hasattr(module, "rope_type") and hasattr(module, "inv_freq"):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, type(module)(config).to(device))
    return model.eval(), dict(config.rope_parameters)


def sample_key(reader: str, task: str, length: int, kwargs: dict, sample: Any) -> tuple:
    """The record key (`record_key`) of `sample` (built with `kwargs`: seed, depth, haystack) read by `reader`."""
    return record_key({"reader": reader, "task": task, "haystack": sample.haystack, "length": length, **kwargs})


def deepest_first_then_by_depth(todo: list[tuple[dict, Any]]) -> list[tuple[dict, Any]]:
    """The sample with the deepest needle first (its run keeps the states the others continue from), then one
    sample per depth in turn, so that a cell stopped early holds every depth in equal measure."""
    first_needle = {id(s): min((i.position for i in s.inserts), default=0) for _, s in todo}
    todo = sorted(todo, key=lambda item: -first_needle[id(item[1])])
    if not todo:
        return todo
    groups: dict[Any, list] = {}
    for item in todo[1:]:
        groups.setdefault(item[0]["depth"], []).append(item)
    rounds = [
        group[i]
        for i in range(max(map(len, groups.values()), default=0))
        for group in groups.values()
        if i < len(group)
    ]
    return [todo[0], *rounds]


def cost_and_recall(rows: list[dict[str, Any]]) -> str:
    """Per (reader, task, length): wall and CPU seconds per 1k prompt tokens the sample read itself (a sample that
    continued from a shared haystack beginning read fewer: `shared_prefix_tokens`), answer generation included, as
    sums over the cell; the largest peak RSS seen (and the newest commit's largest, where its samples peaked over 10%
    lower: a cell keeps the samples of every commit that measured it); and, for memory readers, how many of the
    layers had every answer-holding needle readable at the question (retrieval recall@k per layer; mean and minimum
    over samples)."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault((row["reader"], row["task"], int(row["length"]), row.get("device", "cpu")), []).append(row)
    lines = [
        (
            "| reader | task | length | device | n | wall s / 1k tokens | CPU s / 1k tokens | peak RSS (GB) | "
            "layers with the needle readable (mean, min) |"
        ),
        "|---" * 9 + "|",
    ]
    for (reader, task, length, device), group in sorted(cells.items()):
        read = [length - r.get("shared_prefix_tokens", 0) for r in group]
        wall = 1000 * sum(r["seconds"] for r in group) / sum(read)
        timed = [(r["cpu_seconds"], n) for r, n in zip(group, read) if r.get("cpu_seconds") is not None]
        cpu = 1000 * sum(c for c, _ in timed) / sum(n for _, n in timed) if timed else None
        rss = max(r.get("peak_rss_mb", 0) for r in group) / 1024
        newest = group[-1].get("commit")
        newest_rss = max(r.get("peak_rss_mb", 0) for r in group if r.get("commit") == newest) / 1024
        rss_text = f"{rss:.2f}" if newest_rss >= 0.9 * rss else f"{rss:.2f} ({newest_rss:.2f} at `{newest[:10]}`)"
        recall = [r["recall"] for r in group if r.get("recall")]
        found = (
            f"{sum(x['layers_found'] for x in recall) / len(recall):.1f} / {recall[0]['layers']}, "
            f"{min(x['layers_found'] for x in recall)}"
            if recall
            else "-"
        )
        cpu_text = f"{cpu:.1f} (n={len(timed)})" if cpu is not None else "-"
        lines.append(
            f"| `{reader}` | {task} | {length // 1024}k | {device} | {len(group)} | {wall:.1f} | {cpu_text} | "
            f"{rss_text} | {found} |"
        )
    return "\n".join(lines)


def main() -> None:
    args = build_parser().parse_args()
    if args.table:
        rows = load_records(args.out)
        print(markdown_tables(rows) + "\n" + cost_and_recall(rows))
        return
    if Path(args.out).exists() and not args.update:
        raise SystemExit(f"{args.out} exists: pass --update to add samples to it, or choose another --out.")
    if args.checkpoint_dir is not None and args.no_shared_prefix:
        raise SystemExit("--checkpoint-dir saves states on the shared-prefix path: drop --no-shared-prefix to use it.")
    if set(args.readers) & set(LLAMA_CPP_READERS) and (args.model != "smollm2" or args.device != "cpu"):
        raise SystemExit(
            f"--readers {' '.join(LLAMA_CPP_READERS)} read SmolLM2's GGUF file on the CPU: they need --model smollm2 "
            f"and --device cpu, got --model {args.model} --device {args.device}."
        )
    checkpoints = Checkpoints(args.checkpoint_dir, args.checkpoint_every) if args.checkpoint_dir else None
    if args.threads:
        torch.set_num_threads(args.threads)
    done = {record_key(r) for r in load_records(args.out)}
    base, tokenizer = load_backbone(args.model, dtype=getattr(torch, args.dtype))
    base.to(args.device).eval()
    context = args.context or base.config.max_position_embeddings
    fields = dict(args.infllm_fields)
    readers, configs = [], {}
    for name in args.readers:
        if name == "yarn" or name in LLAMA_CPP_READERS:
            continue  # built per length (`yarn_backbone`, `llama_cpp_reader`)
        if name == "backbone":
            readers.append(Reader("backbone", base, window=context))
            configs["backbone"] = {"context": context}
        else:
            model = ha.wrap_with_memory(base, "infllm", **fields).eval()
            model.memory.trace = {}
            label = args.reader_name or "infllm"
            readers.append(Reader(label, model))
            configs[label] = model.memory_config.to_dict()
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    commit = provenance()["git_commit"]
    machine = provenance()["machine"]
    for length in args.lengths:
        if "yarn" in args.readers:
            yarn, rope = yarn_backbone(base, length, context)
            readers = [r for r in readers if r.name != "yarn"] + [Reader("yarn", yarn, window=None)]
            configs["yarn"] = {"context": context, "rope_parameters": rope}
        for name in LLAMA_CPP_READERS:
            if name in args.readers:
                for old in [r for r in readers if r.name == name]:
                    old.close()
                readers = [r for r in readers if r.name != name] + [
                    llama_cpp_reader(name, length, context, args.threads or 1)
                ]
                configs[name] = llama_cpp_config(name, length, context)
        for task in args.tasks:
            samples = []
            seeds = args.seeds or [args.seed + i for i in range(args.samples)]
            for seed in seeds:
                # multi-needle tasks place their needles at random depths (the record's depth is None); a seed keeps
                # its depth whether it comes from --samples or --seeds, so a reader re-run on some seeds reads the
                # same prompts as the cell it is compared with
                i = seed - args.seed
                depth = args.depths[i % len(args.depths)] if task in SINGLE_NEEDLE_TASKS else None
                kwargs = {"seed": seed, "depth": depth}
                if args.haystack:
                    kwargs["haystack"] = args.haystack
                samples.append((kwargs, TASKS[task](tokenizer, length, **kwargs)))
            for reader in readers:
                todo = [(kw, s) for kw, s in samples if sample_key(reader.name, task, length, kw, s) not in done]
                shared = None
                if isinstance(reader.model, ha.MemoryModel) and not args.no_shared_prefix:
                    todo = deepest_first_then_by_depth(todo)
                    names = [  # one checkpoint file per sample: its record key, hashed
                        f"{task}-{length}-seed{kw['seed']}-"
                        + hashlib.sha256(repr(sample_key(reader.name, task, length, kw, s)).encode()).hexdigest()[:12]
                        for kw, s in todo
                    ]
                    shared = SharedPrefixes(reader.model, [s.input_ids for _, s in todo], checkpoints, names)
                    if todo:
                        print(
                            f"{reader.name} {task} {length}: {len(todo)} samples read "
                            f"{shared.tokens_to_read / (len(todo) * length):.2f} of their tokens (shared haystack "
                            "beginnings read once)",
                            flush=True,
                        )
                for j, (kwargs, sample) in enumerate(todo):
                    seed, depth = kwargs["seed"], kwargs["depth"]
                    if isinstance(reader.model, ha.MemoryModel):
                        reader.model.memory.trace = {}
                    start, cpu_start = time.perf_counter(), time.process_time()
                    if shared is not None:
                        new = shared.generate(j, sample.extra["max_new_tokens"], pad)
                    else:
                        new = reader.generate(sample.input_ids, sample.extra["max_new_tokens"], pad)
                    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
                    resumed = shared.resumed.get(j) if shared is not None else None
                    if resumed is not None:  # the runs before read the first `resumed.tokens` (a checkpoint)
                        seconds, cpu_seconds = seconds + resumed.seconds, cpu_seconds + resumed.cpu_seconds
                    prediction = tokenizer.decode(new, skip_special_tokens=True)
                    correct = score(sample.extra["metric"], prediction, sample.answers)
                    row = {
                        "reader": reader.name,
                        "seed": seed,
                        **sample.record(),
                        "depth": depth,
                        "prediction": prediction,
                        "score": correct,
                        "seconds": seconds,
                        "seconds_per_1k_tokens": 1000 * seconds / length,
                        "cpu_seconds": cpu_seconds,  # CPU time of the runs that read it: the cost on a shared machine
                        "shared_prefix_tokens": shared.source.get(j, (0, 0))[1] if shared else 0,
                        "resumed_from_tokens": resumed.tokens if resumed is not None else 0,
                        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                        "peak_device_mb": (
                            torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda") else None
                        ),
                        "config": configs[reader.name],
                        "commit": commit,
                        "machine": machine,
                        "threads": torch.get_num_threads(),
                        "device": args.device,
                        "dtype": args.dtype,
                        "command": " ".join(sys.argv),
                    }
                    if isinstance(reader.model, ha.MemoryModel):
                        row["recall"] = retrieval_recall(reader.model, sample)
                        reader.model.memory.trace = {}
                    append_record(args.out, row)
                    done.add(record_key(row))
                    recall = row.get("recall") or {}
                    print(
                        f"{reader.name:10} {task:18} {length:>7} depth {depth if depth is None else round(depth, 2)} "
                        f"seed {seed:3}: "
                        f"{row['score']:.2f} {prediction!r:24} {seconds:7.1f} s"
                        + (f"  recall {recall['layers_found']}/{recall['layers']} layers" if recall else ""),
                        flush=True,
                    )
    print(markdown_tables(load_records(args.out)))


if __name__ == "__main__":
    main()
