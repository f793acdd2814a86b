"""A real pretrained model with a shipped adapter: SmolLM2-135M + HMT against the same window without memory.

Reads a held-out Jane Austen novel (never seen in training) with
- the bare backbone seeing the last 288 tokens (a sliding window as wide as HMT's text window: 256 + 32 sensory);
- the same backbone fine-tuned the same way without memory (`examples/adapters/smollm2-baseline`, LoRA), with that
  sliding window;
- HMT (`examples/adapters/smollm2-hmt`: LoRA + memory, causal retrieval query), one 256-token segment at a time,
then prints perplexity by position, writes a PNG, and lets HMT continue the novel with `generate`.
Both adapters were trained by `benchmarks/gpu/smollm2_pipeline.sh` (see their model cards).

    python examples/smollm2_demo.py [--length 4096] [--out demo_output]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import time
from pathlib import Path

import torch

import hmt_adapters as ha
from hmt_adapters.backbones import smollm2
from hmt_adapters.data import load_corpus, tokenize_documents
from hmt_adapters.training import perplexity_by_length, sliding_window_nll, token_nll

ADAPTERS = Path(__file__).resolve().parent / "adapters"
WINDOW, STRIDE = 288, 64


def run(out_dir: str, length: int = 4096) -> dict:
    start = time.time()
    base, tokenizer = smollm2()
    base.eval()
    novel = load_corpus("austen", test_documents=1)["test"]  # the held-out split of the training run
    title = novel[0]["title"]
    ids = torch.tensor(tokenize_documents(novel, tokenizer)[0]["input_ids"][:length])
    hmt = ha.MemoryModel.from_pretrained(copy.deepcopy(base), str(ADAPTERS / "smollm2-hmt")).eval()
    tuned = ha.MemoryModel.from_pretrained(copy.deepcopy(base), str(ADAPTERS / "smollm2-baseline")).eval()
    nll = {
        "backbone, sliding window": sliding_window_nll(base, ids, WINDOW, STRIDE),
        "fine-tuned, sliding window": sliding_window_nll(tuned.base_model, ids, WINDOW, STRIDE),
        "HMT (causal query)": token_nll(hmt, ids),
    }
    lengths = [n for n in (512, 1024, 2048, 4096, 8192, 16384, 32768) if n <= ids.numel()]
    result = {
        "document": title,
        "tokens": ids.numel(),
        "window": WINDOW,
        "ppl": {name: perplexity_by_length(v, lengths) for name, v in nll.items()},
        "overall": {name: math.exp(float(v.mean())) for name, v in nll.items()},
    }
    prompt = ids[None, : min(ids.numel(), 2048)]
    continuation = hmt.generate(input_ids=prompt, max_new_tokens=40, do_sample=False, repetition_penalty=1.2)
    result["generation"] = {
        "prompt_tail": tokenizer.decode(prompt[0, -40:]),
        "continuation": tokenizer.decode(continuation[0, prompt.shape[1] :]),
    }
    result["seconds"] = time.time() - start
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "smollm2.json"), "w") as fh:
        json.dump(result, fh, indent=2)
    plot(result, os.path.join(out_dir, "smollm2.png"))
    return result


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, rows in result["ppl"].items():
        lengths = [int(c) for c in rows]
        ax.plot(lengths, [rows[str(c)]["bin"] for c in lengths], marker="o", label=name)
    ax.set(
        xscale="log",
        xlabel="position in the novel (tokens; bin (C/2, C])",
        ylabel="perplexity",
        title=f"SmolLM2-135M on {result['document']} (held out)",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(result: dict) -> str:
    names = list(result["ppl"])
    lengths = list(next(iter(result["ppl"].values())))
    lines = [
        f"SmolLM2-135M on the held-out novel {result['document']} ({result['tokens']} tokens), perplexity of the "
        "tokens in (C/2, C]:",
        f"{'C':>6} | " + " | ".join(f"{n:>26}" for n in names),
    ]
    for c in lengths:
        lines.append(f"{c:>6} | " + " | ".join(f"{result['ppl'][n][c]['bin']:>26.2f}" for n in names))
    lines.append(f"{'all':>6} | " + " | ".join(f"{result['overall'][n]:>26.2f}" for n in names))
    g = result["generation"]
    lines.append(f"HMT continues '...{g['prompt_tail'][-120:]}' with: {g['continuation']!r}")
    lines.append(f"({result['seconds']:.0f} s)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--out", default="demo_output")
    args = parser.parse_args()
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    print(report(run(args.out, args.length)))


if __name__ == "__main__":
    main()
