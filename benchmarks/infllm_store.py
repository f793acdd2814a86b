"""What the InfLLM store's dtype costs: SmolLM2-135M reads a held-out novel with `store_dtype` float32, bfloat16 and
int8, and the perplexity of the tokens past sinks + window (the ones that read retrieved blocks) is compared.

    python benchmarks/infllm_store.py [--tokens 8192] [--threads 1]

Writes `benchmarks/results/infllm_store.json`; `benchmarks/render_docs.py` renders it into docs/infllm.md.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import write_result  # noqa: E402
from hmt_adapters.backbones import smollm2  # noqa: E402
from hmt_adapters.data import load_corpus, tokenize_documents  # noqa: E402
from hmt_adapters.training import token_nll  # noqa: E402

STORES = ("float32", "bfloat16", "int8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the held-out novel read")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base, tokenizer = smollm2()
    base.eval()
    novel = load_corpus("austen", test_documents=1)["test"]
    ids = torch.tensor(tokenize_documents(novel, tokenizer)[0]["input_ids"][: args.tokens])
    rows, reference = {}, None
    for store in STORES:
        model = ha.wrap_with_memory(base, "infllm", store_dtype=store).eval()
        start = model.memory.sinks + model.memory.window  # predictions from here on read retrieved blocks
        begin = time.process_time()
        with torch.no_grad():
            nll = token_nll(model, ids)
        past = nll[start:]
        reference = past if reference is None else reference
        rows[store] = {
            "perplexity_past_window": math.exp(past.mean().item()),
            "mean_abs_nll_change_vs_float32": (past - reference).abs().mean().item(),
            "max_abs_nll_change_vs_float32": (past - reference).abs().max().item(),
            "tokens_scored": past.numel(),
            "cpu_seconds": time.process_time() - begin,
        }
        print(store, rows[store], flush=True)
    write_result(
        "infllm_store",
        {"document": novel[0]["title"], "tokens": ids.numel(), "rows": rows, "command": " ".join(sys.argv)},
    )


if __name__ == "__main__":
    main()
