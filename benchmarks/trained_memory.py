"""Collect `examples/train_longcontext.py` runs on a pretrained backbone into `results/trained_memory.jsonl`: one
line per evaluated sample, the trained memory's, the memory-disabled reader's and any training-free reader's
(`--reader-baseline`, e.g. `infllm` on the untrained backbone) on the same prompts (docs/trained_memory.md).

    python benchmarks/trained_memory.py runs/armt-smollm2 [more runs ...]

Each line: `method` (`"none"` for memory disabled, the reader's method for a training-free reader), `reader`
(`trained`, `memory disabled` or `training-free`), `task`, `segments`, `segment_length`, `trained_steps`, `score`
(exact match, 0 or 1), `answer_nll`, `depth`, `sample`, `run`, `trains` (what the run trained: `memory`,
`memory + LoRA`, `memory + backbone`), `device`, `dtype`, `commit`. A run collected again
replaces its own lines (keyed by run, method, segments and sample), so the file grows run by run. Seconds: it reads
JSON. A run killed before its final evaluation has no samples yet: `--resume --max-steps <its step>` evaluates its
last checkpoint.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RESULTS

OUT = RESULTS / "trained_memory.jsonl"


def trains(args: dict) -> str:
    """What a run trained beside the pretrained backbone: the memory alone, with LoRA or with all backbone weights."""
    return "memory" + (" + LoRA" if args.get("lora") else "") + (" + backbone" if args.get("train_backbone") else "")


def rows_of(run: Path) -> list[dict]:
    """The per-sample lines of one run's `report.json`."""
    report = json.loads((run / "report.json").read_text())
    args, config, prov = report["args"], report["memory_config"], report["provenance"]
    common = {
        "task": args["task"],
        "segment_length": args["segment_length"],
        "trained_steps": report.get("steps"),
        "run": run.name,
        "device": prov.get("device", "cpu"),
        "dtype": "float32",
        "commit": prov.get("git_commit"),
        "lr": args["lr"],
        "batch_size": args["batch_size"],
        "backbone": args["model"],
        "trains": trains(args),
    }
    rows = []
    for cell in report.get("accuracy", {}).values():
        readers = [(config["method"], "trained", cell)]
        if "memory_disabled" in cell:
            readers.append(("none", "memory disabled", cell["memory_disabled"]))
        # training-free readers of the untrained backbone (`--reader-baseline`)
        readers += [(name, "training-free", result) for name, result in cell.get("readers", {}).items()]
        for method, reader, result in readers:
            for i, sample in enumerate(result["per_sample"]):
                rows.append(
                    {
                        **common,
                        "method": method,
                        "reader": reader,
                        "segments": cell["segments"],
                        "sample": i,
                        "depth": sample["depth"],
                        "score": float(sample["exact"]),
                        "answer_nll": sample["answer_nll"],
                    }
                )
    return rows


def key(row: dict) -> tuple:
    return row["run"], row["method"], row["segments"], row["sample"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="--output folders of examples/train_longcontext.py")
    args = parser.parse_args(argv)
    kept = {}
    if OUT.is_file():
        kept = {key(r): r for r in map(json.loads, OUT.read_text().splitlines()) if r}
    new = [row for run in args.runs for row in rows_of(run)]
    ran = {row["run"] for row in new}
    kept = {k: r for k, r in kept.items() if r["run"] not in ran}
    kept.update({key(row): row for row in new})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(row) + "\n" for row in kept.values()))
    print(f"{len(new)} samples of {len(ran)} run(s) into {OUT} ({len(kept)} in all)")


if __name__ == "__main__":
    main()
