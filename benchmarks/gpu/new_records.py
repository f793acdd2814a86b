"""The per-sample records a run on the GPU machine added: those of the given JSONL files whose key
(`hmt_adapters.evaluation.records.record_key`) the committed results file lacks, each key once, written to one file
that is appended to the committed one here.

    python benchmarks/gpu/new_records.py benchmarks/results/infllm.jsonl OUT.jsonl RUN1.jsonl [RUN2.jsonl ...]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterable
from typing import Any

from hmt_adapters.evaluation.records import load_records, record_key


def new_records(paths: Iterable[str | os.PathLike], known: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of the files `paths` whose key the file `known` lacks, the first of each key."""
    seen = {record_key(row) for row in load_records(known)}
    new = []
    for path in paths:
        for row in load_records(path):
            if record_key(row) not in seen:
                seen.add(record_key(row))
                new.append(row)
    return new


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("known", help="the committed results file")
    parser.add_argument("out", help="where the new records go (replaced)")
    parser.add_argument("runs", nargs="*", help="the run's JSONL files")
    args = parser.parse_args(argv)
    new = new_records(args.runs, args.known)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in new)
    print(len(new), "new records,", sum(row.get("score", 0) for row in new), "correct")


if __name__ == "__main__":
    main()
