"""The main demo (`make demo`): memory at work, printed as tables and drawn as PNGs in demo_output/.

Part 1: a tiny model trained from scratch on long-range recall, with and without memory.
Part 2: SmolLM2-135M with the shipped HMT adapter on a held-out novel, against the same window without memory.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

import recall_demo  # noqa: E402
import smollm2_demo  # noqa: E402


def main() -> None:
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    out = os.environ.get("DEMO_OUTPUT", "demo_output")
    print("== Part 1: long-range recall, tiny Llama trained from scratch ==")
    print(recall_demo.report(recall_demo.run(out)))
    print(f"Plot: {os.path.join(out, 'recall.png')}")
    print("\n== Part 2: SmolLM2-135M + the shipped HMT adapter on a held-out novel ==")
    print(smollm2_demo.report(smollm2_demo.run(out)))
    print(f"Plot: {os.path.join(out, 'smollm2.png')}")


if __name__ == "__main__":
    main()
