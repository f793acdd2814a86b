"""Long-context suite: passkey, RULER needles and variable tracking, BABILong-style qa1-qa3 and book
perplexity against length, for each saved memory adapter and the bare backbone's baselines.

Readers (every table has all of them):
- `backbone_truncated`: the bare backbone on the last `context` tokens of the prompt (its trained context, 8192 for
  SmolLM2); at lengths up to its context this *is* full attention over the whole prompt;
- `backbone_window`: the bare backbone on the last W tokens, W = the first adapter's window (segment + sensory
  tokens): a plain sliding window of the memory model's width (the question is at the end of every prompt);
- `backbone_full`: full attention over the whole prompt past the context (RoPE beyond its trained positions), run
  where it fits (`--full-max` tokens);
- one per adapter (`--adapters name=path`), the `MemoryModel` reading the whole prompt through its memory;
- one per method (`--methods m1 m2 ...`), `<method> (zero-shot)`: the bare backbone wrapped with that method,
  untrained, at `--segment-length` tokens per segment (see `hmt_adapters.evaluation.zero_shot`); `--memory preset`
  keeps each method's default store, `--memory cover` sizes it to hold the longest prompt.

    python benchmarks/longcontext.py --model smollm2 --adapters hmt=examples/adapters/smollm2-hmt \
        --tasks passkey niah_single --lengths 4k 8k 16k --samples 3 \
        --methods transformer_xl memorizing_transformer trams unimix elastic melodi rmt hmt --memory cover

Writes `benchmarks/results/longcontext.json` (every sample: task, reader, query, needle positions, length, prediction,
score; commit and device) after every (task, length), and `longcontext.png` (accuracy against length per reader).
`--lm-eval-tasks DIR` also writes the same samples as local lm-eval tasks (see `hmt_adapters.evaluation.harness`).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import provenance, pyplot, write_result  # noqa: E402
from hmt_adapters.backbones.pretrained import load_backbone  # noqa: E402
from hmt_adapters.data import load_corpus, tokenize_documents  # noqa: E402
from hmt_adapters.evaluation import TASKS, Reader, accuracy_table, answer_rows, book_perplexity, make_samples  # noqa: E402
from hmt_adapters.evaluation.zero_shot import SEGMENT_LENGTH, memory_policies, zero_shot_readers  # noqa: E402

DEFAULT_ADAPTERS = ["hmt=examples/adapters/smollm2-hmt"]


def parse_length(text: str) -> int:
    """`4096`, `4k` (4096), `1M` (1048576)."""
    scale = {"k": 2**10, "m": 2**20}.get(text[-1].lower(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"length {text!r} is not a number of tokens like 4096, 4k or 1M") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"length must be >= 1, got {text!r}")
    return value


def readers(args: argparse.Namespace) -> tuple[list[Reader], dict]:
    policies = memory_policies(args.memory, args.methods)  # bad words fail before the backbone loads
    base, tokenizer = load_backbone(args.model)
    base = base.to(args.device).eval()
    adapters = dict(pair.split("=", 1) for pair in args.adapters)
    models = {
        name: ha.MemoryModel.from_pretrained(copy.deepcopy(base), path).eval() for name, path in adapters.items()
    }
    context = args.context or base.config.max_position_embeddings
    first = next(iter(models.values()), None)
    window = args.window or (
        first.memory_config.segment_length + getattr(first.memory_config, "sensory_length", 0)
        if first is not None
        else 256
    )
    out = [Reader("backbone_truncated", base, window=context), Reader("backbone_window", base, window=window)]
    if args.full_max > context:
        out.append(Reader("backbone_full", base, max_length=args.full_max))
    out += [Reader(name, model) for name, model in models.items()]
    zero_shot, zero_shot_info = zero_shot_readers(
        base, args.methods, segment_length=args.segment_length, memory=policies, cover=max(args.lengths)
    )
    out += zero_shot
    info = {
        "model": args.model,
        "context": context,
        "window": window,
        "full_max": args.full_max,
        "tokenizer": tokenizer,
        "adapters": {
            n: {"path": p, "method": models[n].method, "config": models[n].memory_config.to_dict()}
            for n, p in adapters.items()
        },
        "zero_shot": {"memory": " ".join(args.memory), "cover": max(args.lengths), "readers": zero_shot_info},
    }
    return out, info


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    tasks = list(result["table"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.2 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for reader, by_length in result["table"][task].items():
            lengths = sorted(by_length, key=int)
            ax.plot([int(c) for c in lengths], [by_length[c]["accuracy"] for c in lengths], marker="o", label=reader)
        ax.set(xscale="log", xlabel="prompt length (tokens)", ylabel="accuracy", ylim=(-0.05, 1.05), title=task)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{result['model']}: long-context accuracy against length")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    """The command line (separate from `main` so tests can check what it accepts)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="'smollm2' (offline SmolLM2-135M) or a causal LM path")
    p.add_argument("--adapters", nargs="*", default=DEFAULT_ADAPTERS, help="name=path pairs of saved adapters")
    p.add_argument(
        "--methods",
        nargs="*",
        default=[],
        choices=ha.available_methods(),
        metavar="METHOD",
        help=f"memory methods run zero-shot (untrained) on the bare backbone, one reader each: "
        f"{' '.join(ha.available_methods())}",
    )
    p.add_argument("--segment-length", type=int, default=SEGMENT_LENGTH, help="the zero-shot readers' segment")
    p.add_argument(
        "--memory",
        nargs="+",
        default=["cover"],
        metavar="POLICY",
        help="zero-shot stores: 'preset' (each method's default size) or 'cover' (sized to hold the "
        "longest prompt), for all methods or per method as method=policy",
    )
    p.add_argument("--tasks", nargs="+", default=["passkey", "niah_single"], choices=sorted(TASKS))
    p.add_argument("--lengths", nargs="+", type=parse_length, default=[4096, 8192, 16384])
    p.add_argument(
        "--samples", type=int, default=3, help="samples per (task, length); single needles spread 0..1 deep"
    )
    p.add_argument(
        "--haystack",
        default=None,
        choices=["essays", "kjv", "repeat"],
        help="haystack for every task (default: essays for needles, kjv for qa)",
    )
    p.add_argument("--context", type=int, default=None, help="backbone_truncated's context (default: its config's)")
    p.add_argument("--window", type=int, default=None, help="backbone_window's width (default: the adapter's window)")
    p.add_argument("--full-max", type=parse_length, default=0, help="run backbone_full up to this length (0: never)")
    p.add_argument(
        "--book-lengths",
        nargs="*",
        type=parse_length,
        default=[],
        help="book perplexity at these positions on held-out KJV books (empty: skipped)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--name", default="longcontext", help="results file name")
    p.add_argument("--lm-eval-tasks", default=None, help="also write the samples as lm-eval tasks into this folder")
    return p


def main() -> None:
    args = build_parser().parse_args()

    all_readers, info = readers(args)
    tokenizer = info.pop("tokenizer")
    started = provenance()["git_commit"]  # the code that runs (files written later record the commit at writing)
    result = {
        "command": " ".join(sys.argv),
        "started_at_commit": started,
        **info,
        "tasks": args.tasks,
        "lengths": args.lengths,
        "samples": args.samples,
        "readers": [r.name for r in all_readers],
        "rows": [],
        "table": {},
        "book": {},
    }
    exported = {}
    for task in args.tasks:
        for length in args.lengths:
            start = time.perf_counter()
            samples = make_samples(task, tokenizer, length, args.samples, seed=args.seed, haystack=args.haystack)
            exported[f"{task}_{length}"] = samples
            result["rows"] += answer_rows(all_readers, samples, tokenizer)
            result["table"] = accuracy_table(result["rows"])
            scores = {
                r: v[str(length)]["accuracy"] for r, v in result["table"].get(task, {}).items() if str(length) in v
            }
            print(
                f"{task:18} {length:>8}  "
                + "  ".join(f"{r} {a:.2f}" for r, a in scores.items())
                + f"  ({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            path = write_result(args.name, result)
            plot(result, path.with_suffix(".png"))
    if args.book_lengths:
        docs = tokenize_documents(
            load_corpus("kjv", 7)["test"], tokenizer
        )  # the split examples/train_hmt.py holds out
        title, ids = max(zip(docs["title"], docs["input_ids"]), key=lambda d: len(d[1]))
        ids = torch.tensor(ids[: max(args.book_lengths)])
        result["book"] = {"document": title, "tokens": ids.numel(), "ppl": {}}
        for reader in all_readers:
            if reader.fits(ids.numel()):
                result["book"]["ppl"][reader.name] = book_perplexity(reader, [ids], args.book_lengths)
                print(
                    f"book {reader.name:18} "
                    + " ".join(f"{c}: {v['bin']:.2f}" for c, v in result["book"]["ppl"][reader.name].items()),
                    flush=True,
                )
        path = write_result(args.name, result)
    plot(result, path.with_suffix(".png"))
    if args.lm_eval_tasks:  # lm-eval is an optional extra: imported only when tasks are exported
        from hmt_adapters.evaluation.harness import write_lm_eval_tasks

        print("lm-eval tasks:", write_lm_eval_tasks(args.lm_eval_tasks, exported, tokenizer))


def readme_section(data: dict, name: str = "longcontext") -> str:
    """The README's long-context tables (one per task: accuracy per reader and length, with sample counts)."""
    prov = data.get("provenance", {})
    lines = [
        f"`{data['command'].replace('benchmarks/longcontext.py', 'python benchmarks/longcontext.py')}` "
        f"(commit `{(prov.get('git_commit') or '?')[:10]}`, {prov.get('device', 'cpu')}); backbone context "
        f"{data['context']}, window {data['window']} tokens; accuracy (samples per cell in brackets):",
        "",
    ]
    for task, by_reader in data["table"].items():
        lengths = sorted({int(c) for v in by_reader.values() for c in v})
        lines += [
            f"**{task}**",
            "",
            "| reader | " + " | ".join(f"{c // 1024}k" for c in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for reader in data["readers"]:
            cells = by_reader.get(reader, {})
            lines.append(
                f"| `{reader}` | "
                + " | ".join(
                    f"{cells[str(c)]['accuracy']:.2f} ({cells[str(c)]['samples']})" if str(c) in cells else "not run"
                    for c in lengths
                )
                + " |"
            )
        lines.append("")
    seconds = seconds_per_prompt(data["rows"])
    if seconds:
        lengths = sorted({int(c) for v in seconds.values() for c in v})
        lines += [
            "**Seconds per prompt** (mean over the task samples above, this run's machine and load):",
            "",
            "| reader | " + " | ".join(f"{c // 1024}k" for c in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        lines += [
            f"| `{r}` | "
            + " | ".join(f"{seconds[r][str(c)]:.1f}" if str(c) in seconds[r] else "not run" for c in lengths)
            + " |"
            for r in data["readers"]
            if r in seconds
        ]
        lines.append("")
    if data.get("book", {}).get("ppl"):
        book = data["book"]
        lengths = list(next(iter(book["ppl"].values())))
        lines += [
            f"**Book perplexity**, held-out KJV *{book['document']}*, tokens in (C/2, C]:",
            "",
            "| reader | " + " | ".join(lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        lines += [
            f"| `{r}` | " + " | ".join(f"{v[c]['bin']:.2f}" for c in lengths) + " |" for r, v in book["ppl"].items()
        ]
        lines.append("")
    zero_shot = data.get("zero_shot", {}).get("readers", {})
    if zero_shot:
        lines += [f"Zero-shot readers (untrained, `--memory {data['zero_shot']['memory']}`):", ""]
        lines += [
            f"- `{reader}`: {z['memory']} store, {store_size(z['config'])}; {z['untrained']}."
            for reader, z in zero_shot.items()
        ]
        lines.append("")
    lines.append(f"![long-context accuracy](benchmarks/results/{name}.png)")
    return "\n".join(lines)


def seconds_per_prompt(rows: list[dict]) -> dict[str, dict[str, float]]:
    """{reader: {length: mean seconds to answer one prompt}} over the rows that ran."""
    times: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if row.get("seconds") is not None:
            times.setdefault(row["reader"], {}).setdefault(str(row["length"]), []).append(row["seconds"])
    return {r: {c: sum(v) / len(v) for c, v in by_length.items()} for r, by_length in times.items()}


def store_size(config: dict) -> str:
    """A zero-shot reader's segment and memory size, in the words of its config's fields."""
    keys = (
        "memory_size",
        "select_size",
        "memory_window",
        "long_term_windows",
        "hippo_order",
        "num_memory_tokens",
        "sensory_length",
    )
    sizes = ", ".join(f"{k} {config[k]}" for k in keys if config.get(k) is not None)
    return f"segment {config['segment_length']}" + (f", {sizes}" if sizes else "")


if __name__ == "__main__":
    main()
