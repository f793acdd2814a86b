"""Per-sample results that accumulate across runs: one JSON line per (reader, task, haystack, length, depth, seed),
so a cell grows with every run (`--update` adds samples, never duplicates them), and tables with the sample count
and a 95% Wilson score interval per cell."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

KEY_FIELDS = ("reader", "task", "haystack", "length", "depth", "seed")


def record_key(row: dict[str, Any]) -> tuple:
    """The identity of a per-sample record: `(reader, task, haystack, length, depth, seed)`; a row missing one of
    these fields is a `ValueError` naming it."""
    missing = [f for f in KEY_FIELDS if f not in row]
    if missing:
        raise ValueError(f"A result record needs the fields {list(KEY_FIELDS)}; missing {missing}.")
    depth = row["depth"]
    return (
        row["reader"],
        row["task"],
        row["haystack"],
        int(row["length"]),
        None if depth is None else round(float(depth), 6),
        int(row["seed"]),
    )


def load_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a JSONL results file (none if the file does not exist); a later duplicate key replaces an
    earlier one."""
    if not os.path.exists(path):
        return []
    by_key: dict[tuple, dict[str, Any]] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not a JSON line ({err}).") from None
            by_key[record_key(row)] = row
    return list(by_key.values())


def append_record(path: str | os.PathLike, row: dict[str, Any]) -> None:
    """Append one record as a JSON line and flush it to disk (a run stopped midway keeps what it finished)."""
    record_key(row)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def wilson_interval(successes: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% for the default `z`); `(0, 1)` for `n = 0`."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"Need 0 <= successes <= n, got successes={successes}, n={n}.")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def cell_table(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[int, dict[str, float]]]]:
    """{task: {reader: {length: {accuracy, samples, low, high, depths}}}} over records with a score; the interval
    treats each score as a success fraction (exact for 0/1 scores)."""
    scores: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    depths: dict = defaultdict(set)
    for row in rows:
        if row.get("score") is None:
            continue
        scores[row["task"]][row["reader"]][int(row["length"])].append(float(row["score"]))
        depths[(row["task"], row["reader"], int(row["length"]))].add(row.get("depth"))
    out: dict = {}
    for task, by_reader in scores.items():
        for reader, by_length in by_reader.items():
            for length, values in by_length.items():
                low, high = wilson_interval(sum(values), len(values))
                out.setdefault(task, {}).setdefault(reader, {})[length] = {
                    "accuracy": sum(values) / len(values),
                    "samples": len(values),
                    "low": low,
                    "high": high,
                    "depths": len(depths[(task, reader, length)]),
                }
    return out


def _cell(cell: dict[str, float]) -> str:
    return f"{cell['accuracy']:.2f} (n={cell['samples']}, [{cell['low']:.2f}, {cell['high']:.2f}])"


def markdown_tables(rows: Sequence[dict[str, Any]]) -> str:
    """One markdown table per task: accuracy, samples and the 95% Wilson interval per reader and length."""
    table = cell_table(rows)
    lines = []
    for task, by_reader in table.items():
        lengths = sorted({c for v in by_reader.values() for c in v})
        header = "| reader | " + " | ".join(f"{c // 1024}k" for c in lengths) + " |"
        lines += [
            f"**{task}** (accuracy, samples n, 95% Wilson interval)",
            "",
            header,
            "|---" * (len(lengths) + 1) + "|",
        ]
        for reader, cells in sorted(by_reader.items()):
            row = " | ".join(_cell(cells[c]) if c in cells else "-" for c in lengths)
            lines.append(f"| `{reader}` | {row} |")
        lines.append("")
    return "\n".join(lines)
