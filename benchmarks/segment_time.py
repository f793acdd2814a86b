"""Per-segment time of `step` streams of several methods, interleaved segment by segment (one torch thread).

    python benchmarks/segment_time.py --methods hmt elastic --segment 128 [--segments 56] [--tiny]

Times are the process's CPU time per segment (other jobs on a shared machine do not inflate it); the summary is the
median over the segments after `--skip` (default 24: past the first matrices Elastic Memory keeps in its cache, so
every segment builds its own, as any long stream does). `--tiny`: the 2-layer width-64 Llama of `cost.py`'s
streams instead of the 4-layer width-256 one. docs/elastic_memory.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import small_llama  # noqa: E402

TINY = dict(layers=2, dim=64, heads=4, kv_heads=2, ffn=128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["hmt", "elastic"])
    parser.add_argument("--segment", type=int, default=128)
    parser.add_argument("--segments", type=int, default=56)
    parser.add_argument("--skip", type=int, default=24)
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = TINY if args.tiny else {}
    models = {m: ha.wrap_with_memory(small_llama(**size), m, segment_length=args.segment).eval() for m in args.methods}
    states: dict[str, ha.MemoryState | None] = {m: None for m in args.methods}
    times: dict[str, list[float]] = {m: [] for m in args.methods}
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in range(args.segments):
            ids = torch.randint(0, 8192, (1, args.segment), generator=gen)
            for m in args.methods if n % 2 == 0 else reversed(args.methods):
                start = time.process_time()
                _, states[m] = models[m].step(ids, states[m])
                times[m].append(time.process_time() - start)
    model = "2-layer width-64" if args.tiny else "4-layer width-256"
    print(f"{model} Llama, segments of {args.segment}, median CPU ms of segments {args.skip}..{args.segments - 1}")
    first = statistics.median(times[args.methods[0]][args.skip :])
    for m in args.methods:
        late = times[m][args.skip :]
        print(
            f"{m:24} {statistics.median(late) * 1e3:8.1f} ms  (single segments {min(late) * 1e3:.1f}-"
            f"{max(late) * 1e3:.1f})  x {args.methods[0]}: {statistics.median(late) / first:.2f}"
        )


if __name__ == "__main__":
    main()
