"""The lab's one entry point: `python -m benchmarks.run TASK [options]` (options go to the task's script;
`python -m benchmarks.run TASK --help` lists them; `python -m benchmarks.run` lists the tasks). Each task writes
`benchmarks/results/<name>.json` (with the git commit, machine and device), most a PNG too; `docs` renders the docs
pages' tables and the shipped adapters' model cards from those files (benchmarks/README.md says what each measures
and how long it takes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# task -> (script, what it measures); every script of benchmarks/ with a command line is here
TASKS = {
    "recall": ("recall.py", "long-range recall, a tiny model trained from scratch with each method"),
    "real-text": ("real_text.py", "a tiny Llama from scratch per method on real long text: ppl vs sliding window"),
    "ppl-vs-length": ("ppl_vs_length.py", "perplexity against context length, SmolLM2-135M + saved adapters"),
    "longcontext": ("longcontext.py", "passkey, RULER, BABILong-style QA, book ppl: adapters vs the backbone, 4k-1M"),
    "longcontext-train-tiny": (
        "longcontext_train_tiny.py",
        "collect examples/train_longcontext.py runs: passkey to 1M tokens",
    ),
    "trained-memory": (
        "trained_memory.py",
        "collect train_longcontext.py runs on SmolLM2: exact per sample, memory off",
    ),
    "trained-memory-probe": ("trained_memory_probe.py", "candidate memory writes on frozen SmolLM2, side by side"),
    "lm-eval-ruler": ("lm_eval_ruler.py", "lm-eval's own RULER tasks offline: bare at 4k, the default reader at 32k+"),
    "infllm": ("infllm.py", "training-free block retrieval on SmolLM2-135M: needles and passkeys, 4k-1M, per sample"),
    "infllm-cost": ("infllm_cost.py", "CPU seconds per 1k tokens and decode speed of InfLLM as the document grows"),
    "infllm-memory": ("infllm_memory.py", "where a long InfLLM read's resident memory goes (RAM, page files)"),
    "infllm-store": ("infllm_store.py", "the InfLLM store's dtype (fp32, bf16, fp16, int8): perplexity and bytes"),
    "cost": ("cost.py", "tokens/s, FLOPs and peak memory of every method against the bare backbone, 4k-1M tokens"),
    "cost-report": ("cost_report.py", "docs/cost.md's tables: speed x FLOPs, peak memory, length, decode per method"),
    "attention-cost": ("attention_cost.py", "the UniMem presets' cost (TRAMS against Transformer-XL)"),
    "segment-time": ("segment_time.py", "per-segment time of step() streams, methods interleaved"),
    "elastic": ("elastic.py", "HiPPO reconstruction (Table 12), Elastic Memory throughput and state size"),
    "melodi": ("melodi.py", "MELODI memory bytes against XL/Memorizing, throughput"),
    "training-memory": ("training_memory.py", "peak training memory against BPTT depth, offload/checkpointing"),
    "last-segment-loss": (
        "last_segment_loss.py",
        "last-segment loss at depth 16: the head skip against every-token loss",
    ),
    "docs": ("render_docs.py", "render the docs pages' tables and the model cards from benchmarks/results/"),
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
