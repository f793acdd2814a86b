"""Where a long InfLLM read's resident memory goes: SmolLM2-135M (bf16 weights) reads a standard passkey prompt with
the 1M-token reader's configuration (the shipped default reader `examples/adapters/smollm2-infllm` with the int8 store
in memory-mapped files, docs/infllm.md "A million tokens") through `model.step` in pieces, and after each piece the
process's resident memory is split by kind from `/proc/self/smaps` (Linux): the C heap (`[heap]`), other anonymous
mappings, and the store's file pages. At the end the heap is measured again after `malloc_trim` (what the state
holds; the rest is heap the allocator keeps in holes).

    python benchmarks/infllm_memory.py --tokens 262144 --store /tmp/infllm-blocks [--piece 16384] [--threads 1]

Prints one JSON line per piece and a last one with the totals.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from hmt_adapters.evaluation import TASKS  # noqa: E402
from hmt_adapters.methods.infllm.block_pages import resident_kib_by_mapping  # noqa: E402

RECIPE = Path(__file__).resolve().parents[1] / "examples" / "adapters" / "smollm2-infllm"


def resident_mb() -> dict[str, int]:
    """Resident MB of the process by kind: `heap` (the C heap), `anon` (other anonymous mappings), `file`."""
    out = {"heap": 0, "anon": 0, "file": 0}
    for name, kib in resident_kib_by_mapping().items():
        out["heap" if name == "[heap]" else ("file" if name.startswith("/") else "anon")] += kib
    return {kind: kib // 1024 for kind, kib in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=262144)
    parser.add_argument("--piece", type=int, default=16384, help="tokens per `model.step` call")
    parser.add_argument("--store", required=True, help="directory for the store's memory-mapped files")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = ha.AutoMemoryModelForCausalLM.from_pretrained(
        str(RECIPE), dtype=torch.bfloat16, store_dtype="int8", store_disk=args.store
    ).eval()
    ids = torch.tensor([TASKS["passkey_standard"](model.tokenizer, args.tokens, seed=0, depth=0.5).input_ids])
    state, start = None, time.process_time()
    with torch.no_grad():
        for end in range(args.piece, args.tokens + 1, args.piece):
            _, state = model.step(ids[:, end - args.piece : end], state, return_logits=False)
            row = {"tokens": end, "cpu_s": round(time.process_time() - start), **resident_mb()}
            print(json.dumps(row), flush=True)
    ctypes.CDLL(None).malloc_trim(0)
    print(json.dumps({"tokens": args.tokens, "after_malloc_trim": resident_mb(), "entries": len(state.tensors)}))


if __name__ == "__main__":
    main()
