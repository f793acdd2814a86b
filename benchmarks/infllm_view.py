"""What the question's chunk of the default `"infllm"` reader sees, rebuilt as a plain prompt and read by the bare
model (full attention, contiguous positions): whether a miss is the reader's or the backbone's (docs/infllm.md, "Not
done yet"). One JSON line per (task, length, seed, window, view) in `--out`; samples already there are skipped.

The view is the chunk's under `block_positions="ordered"`: the sinks, the blocks holding the answer's needle with
both neighbours (the blocks the default retrieves where its recall is 30 of 30 layers), the tail of `window` tokens
and the last chunk. Variants (`--views`):
- `ordered`: that view; `near`: the blocks after the tail, next to the chunk;
- `no-sinks`: the view without the sinks; `tail=N`: the tail cut to its last N tokens.
With `--reader`, each sample is also read by the reader itself (`wrap_with_memory(base, "infllm", window=...)`),
whose answer the record holds beside the views'. The rebuilt view is no exact stand-in: the reader's tail keys were
computed by the reader with its own earlier views.

    python benchmarks/infllm_view.py --task passkey_standard --length 8k --window 1536 --seeds 0 1 2 --reader
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from hmt_adapters.evaluation import TASKS, Reader, score  # noqa: E402
from hmt_adapters.evaluation.harness import load_backbone  # noqa: E402
from hmt_adapters.evaluation.samples import Sample  # noqa: E402
from hmt_adapters.evaluation.tasks import SINGLE_NEEDLE_TASKS  # noqa: E402
from infllm import DEPTHS  # noqa: E402  (seed s reads the prompt benchmarks/infllm.py's seed s reads)
from longcontext import parse_length  # noqa: E402


def question_view(sample: Sample, window: int, sinks: int, block: int, chunk: int, view: str = "ordered") -> list[int]:
    """The token ids the last chunk of `sample` reads (module docstring), laid out as `view`."""
    ids = list(sample.input_ids)
    chunk_from = (len(ids) - 1) // chunk * chunk
    tail_from = max(sinks, chunk_from - window)
    holding = [i for i in sample.inserts if any(a in i.text for a in sample.answers)] or sample.inserts
    blocks = sorted(
        {
            b
            for i in holding
            if i.position < tail_from
            for b in range((i.position - sinks) // block - 1, (i.position + i.num_tokens - 1 - sinks) // block + 2)
            if b >= 0 and sinks + (b + 1) * block <= tail_from
        }
    )
    retrieved = [t for b in blocks for t in ids[sinks + b * block : sinks + (b + 1) * block]]
    head, tail, last = ids[:sinks], ids[tail_from:chunk_from], ids[chunk_from:]
    if view == "ordered":
        return head + retrieved + tail + last
    if view == "near":
        return head + tail + retrieved + last
    if view == "no-sinks":
        return retrieved + tail + last
    if view.startswith("tail="):
        return head + retrieved + tail[len(tail) - int(view[5:]) :] + last
    raise ValueError(f"view {view!r}: expected 'ordered', 'near', 'no-sinks' or 'tail=N'")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="passkey_standard", choices=sorted(TASKS))
    parser.add_argument("--length", type=parse_length, default=8192)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(10)))
    parser.add_argument("--views", nargs="+", default=["ordered"])
    parser.add_argument("--reader", action="store_true", help="also read each sample with the reader itself")
    parser.add_argument("--out", default="runs/infllm_view.jsonl")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base, tokenizer = load_backbone("smollm2", dtype=torch.float32)
    base.eval()
    model = ha.wrap_with_memory(base, "infllm", window=args.window).eval()
    sinks, block, chunk = model.memory.sinks, model.memory.block, model.memory_config.segment_length
    pad = tokenizer.eos_token_id
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {(r["task"], r["length"], r["seed"], r["window"], r["view"]) for r in map(json.loads, out.open())}
    for seed in args.seeds:
        depth = DEPTHS[seed % len(DEPTHS)] if args.task in SINGLE_NEEDLE_TASKS else None
        sample = TASKS[args.task](tokenizer, args.length, seed=seed, depth=depth)
        views = [v for v in args.views if (args.task, args.length, seed, args.window, v) not in done]
        if not views:
            continue
        new_tokens = sample.extra["max_new_tokens"]
        reader: dict[str, Any] = {}
        if args.reader:
            answer = tokenizer.decode(Reader("r", model).generate(sample.input_ids, new_tokens, pad), True)
            reader = {"reader": answer, "reader_score": score(sample.extra["metric"], answer, sample.answers)}
        for view in views:
            ids = question_view(sample, args.window, sinks, block, chunk, view)
            answer = tokenizer.decode(Reader("bare", base, window=None).generate(ids, new_tokens, pad), True)
            row = {
                "task": args.task,
                "length": args.length,
                "seed": seed,
                "window": args.window,
                "view": view,
                "view_tokens": len(ids),
                "prediction": answer,
                "score": score(sample.extra["metric"], answer, sample.answers),
                **reader,
            }
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
