"""Perplexity against context length on held-out documents: a trained memory adapter against the sliding-window
baseline of the same window (the backbone on each segment alone, `model.disable_memory()`).

For each context length C, every held-out document is cut into chunks of C tokens; each chunk is read from an empty
memory. Corpus perplexity = exp(total NLL / total predicted tokens) over all chunks of that length.

    python examples/eval_ppl.py --adapter runs/hmt/stage2 --corpus austen --lengths 1024 2048 4096 8192
"""

from __future__ import annotations

import argparse
import json
import math
import os

import hmt_adapters as ha
from hmt_adapters.backbones import smollm2
from hmt_adapters.data import load_corpus, tokenize_documents
from hmt_adapters.training import corpus_nll


def chunks(documents: list[list[int]], length: int, max_chunks: int) -> list[list[int]]:
    """The first `max_chunks` full chunks of `length` tokens, document after document."""
    return [d[s : s + length] for d in documents for s in range(0, len(d) - length + 1, length)][:max_chunks]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapter", required=True, help="folder written by train_hmt.py (e.g. runs/hmt/stage2)")
    p.add_argument("--corpus", default="austen")
    p.add_argument("--test-documents", type=int, default=1)
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--max-chunks", type=int, default=4, help="chunks per context length")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--out", default=None, help="write the table as JSON here")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    base, tokenizer = smollm2()
    model = ha.MemoryModel.from_pretrained(base, args.adapter).eval()
    documents = list(tokenize_documents(load_corpus(args.corpus, args.test_documents)["test"], tokenizer)["input_ids"])
    window = model.memory_config.segment_length
    rows = []
    print(f"{'context':>8} {'chunks':>6} {'memory ppl':>11} {f'window-{window} ppl':>16} {'gain':>7}")
    for length in sorted(args.lengths):
        windows = chunks(documents, length, args.max_chunks)
        if not windows:
            print(f"{length:>8}: the held-out documents are shorter; skipped")
            continue
        nll, tokens = corpus_nll(model, windows, args.batch_size, progress=True)
        with model.disable_memory():
            base_nll, _ = corpus_nll(model, windows, args.batch_size, progress=True)
        memory_ppl, window_ppl = math.exp(nll / tokens), math.exp(base_nll / tokens)
        rows.append(
            {
                "context": length,
                "chunks": len(windows),
                "tokens": tokens,
                "memory_ppl": memory_ppl,
                "sliding_window_ppl": window_ppl,
            }
        )
        print(
            f"{length:>8} {len(windows):>6} {memory_ppl:>11.2f} {window_ppl:>16.2f} "
            f"{1 - memory_ppl / window_ppl:>7.1%}"
        )
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as fh:
            json.dump(
                {
                    "adapter": args.adapter,
                    "corpus": args.corpus,
                    "segment_length": window,
                    "method": model.method,
                    "config": model.memory_config.to_dict(),
                    "rows": rows,
                },
                fh,
                indent=2,
            )


if __name__ == "__main__":
    main()
