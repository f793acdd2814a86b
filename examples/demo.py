"""The main demo (`make demo`): memory at work, printed as tables and drawn as PNGs in demo_output/.

Part 1: SmolLM2-135M (8k context) asked about a 16k-token document, bare and with training-free block retrieval.
Part 2: a tiny model trained from scratch on long-range recall, with and without memory.
Part 3: SmolLM2-135M with the shipped HMT adapter on a held-out novel, against the same window without memory.

    python examples/demo.py            # the full demo, about 15 minutes on 2 CPU cores
    python examples/demo.py --smoke    # every step and data path at toy size (about a minute): `make test` runs it
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

import needle_demo  # noqa: E402
import recall_demo  # noqa: E402
import smollm2_demo  # noqa: E402

FULL = {"recall_steps": 4000, "novel_tokens": 4096, "needle_tokens": 16384, "needle_fields": {}}
# one curriculum evaluation; one 512-token perplexity bin; a 1k needle past a 256-token window
SMOKE = {
    "recall_steps": 50,
    "novel_tokens": 512,
    "needle_tokens": 1024,
    "needle_fields": {"segment_length": 128, "window": 256, "sink_tokens": 16, "block_size": 16},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--smoke", action="store_true", help="toy sizes: checks the install and data paths, no results"
    )
    args = parser.parse_args()
    size = SMOKE if args.smoke else FULL
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    out = os.environ.get("DEMO_OUTPUT", os.path.join("demo_output", "smoke") if args.smoke else "demo_output")
    print("== Part 1: more context than SmolLM2-135M was trained on, with no training (infllm) ==")
    print(needle_demo.report(needle_demo.run(out, size["needle_tokens"], **size["needle_fields"])))
    print("\n== Part 2: long-range recall, tiny Llama trained from scratch ==")
    print(recall_demo.report(recall_demo.run(out, max_steps=size["recall_steps"])))
    print(f"Plot: {os.path.join(out, 'recall.png')}")
    print("\n== Part 3: SmolLM2-135M + the shipped HMT adapter on a held-out novel ==")
    print(smollm2_demo.report(smollm2_demo.run(out, length=size["novel_tokens"])))
    print(f"Plot: {os.path.join(out, 'smollm2.png')}")


if __name__ == "__main__":
    main()
