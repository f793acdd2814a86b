"""One entry point for every benchmark: `python -m benchmarks.run TASK [options]` (options go to the task's script;
`python -m benchmarks.run TASK --help` lists them). Each task writes `benchmarks/results/<name>.json` (with the git
commit, machine and device) and a PNG; `readme` renders the README's tables from those files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TASKS = {
    "recall": ("recall.py", "long-range recall, a tiny model trained from scratch with each method"),
    "ppl-vs-length": ("ppl_vs_length.py", "perplexity against context length, SmolLM2-135M + saved adapters"),
    "cost": ("cost.py", "tokens/s, FLOPs and peak memory of every method against the bare backbone, 4k-1M tokens"),
    "attention-cost": ("attention_cost.py", "the UniMem presets' cost (TRAMS against Transformer-XL)"),
    "elastic": ("elastic.py", "HiPPO reconstruction (Table 12), Elastic Memory throughput and state size"),
    "melodi": ("melodi.py", "MELODI memory bytes against XL/Memorizing, throughput"),
    "training-memory": ("training_memory.py", "peak training memory against BPTT depth, offload/checkpointing"),
    "last-segment-loss": (
        "last_segment_loss.py",
        "last-segment loss at depth 16: the head skip against every-token loss",
    ),
    "support-matrix": ("support_matrix.py", "the family x method matrix of tests/test_families.py, for the README"),
    "version-matrix": (
        "version_matrix.py",
        "a fresh venv per release row (floors; every transformers minor): smoke tests and demo smoke",
    ),
    "longcontext": ("longcontext.py", "passkey, RULER, BABILong-style QA, book ppl: adapters vs the backbone, 4k-1M"),
    "longcontext-train-tiny": (
        "longcontext_train_tiny.py",
        "collect examples/train_longcontext.py runs: passkey to 1M tokens",
    ),
    "real-text": (
        "real_text.py",
        "a tiny Llama from scratch per method on real long text: ppl by position vs sliding window",
    ),
    "readme": ("render_readme.py", "render the README's result tables from benchmarks/results/"),
}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TASKS:
        width = max(map(len, TASKS))
        lines = [f"  {name:{width}} {help}" for name, (_, help) in TASKS.items()]
        print("usage: python -m benchmarks.run TASK [options]\n\ntasks:\n" + "\n".join(lines))
        return 2
    script, _ = TASKS[sys.argv[1]]
    return subprocess.run([sys.executable, str(HERE / script), *sys.argv[2:]], cwd=HERE.parent).returncode


if __name__ == "__main__":
    sys.exit(main())
