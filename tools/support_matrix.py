"""Record the family x method support matrix: every cell of `tests/test_families.py` run for its outcome.

    python tools/support_matrix.py      (about a minute on one CPU core)

Each cell wraps the family's tiny random model (`tests/tiny.py`) with the method: a refusal records its
reason (hybrids get their memory layers explicitly: `tests/tiny.py`); a wrapped cell records the largest difference
between its logits with memory disabled and the bare
backbone's on each segment (a cell above 1e-4 is recorded as "wrong", and `tests/test_families.py` fails on it).
Per family, memory reads are checked exact: Transformer-XL with memory covering the document against the bare
backbone over the whole document (above 1e-5 is "inexact").
Writes `tools/results/support_matrix.json`, which `benchmarks/render_docs.py` turns into docs/support_matrix.md and
`tests/test_families.py` compares with its own expectations.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "tools" / "results" / "support_matrix.json"
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import hmt_adapters as ha  # noqa: E402
from cases import METHOD_CASES  # noqa: E402
from tiny import (  # noqa: E402
    FAMILY_NAMES,
    FAMILY_VOCAB,
    STATE_OUTSIDE_ATTENTION,
    family_backbone,
    layer_overrides,
    memory_read_error,
)

SEGMENT = 8
TOLERANCE = 1e-4
READ_TOLERANCE = 1e-5  # memory reads: fp32 noise is ~1e-7, another family's RoPE on memory keys ~1e-3


def memory_reads(family: str, refused: bool) -> dict:
    """Whether memory reads are exact on `family`: Transformer-XL with memory covering the document against the bare
    backbone (`tests/tiny.py::memory_read_error`); not run where attention memory is refused or where state
    outside attention (SSM layers) restarts every segment."""
    if refused:
        return {"outcome": "refused"}
    if family in STATE_OUTSIDE_ATTENTION:
        return {"outcome": "state outside attention"}
    error = memory_read_error(family, SEGMENT)
    return {"outcome": "exact" if error < READ_TOLERANCE else "inexact", "max_abs_diff_xl_covering": error}


def cell(method: str, family: str) -> dict:
    """`{"outcome": "yes" | "refused" | "wrong", ...}` for one method on one family."""
    ids = torch.randint(0, FAMILY_VOCAB, (2, 2 * SEGMENT + 3), generator=torch.Generator().manual_seed(0))
    base = family_backbone(family)
    with torch.no_grad():
        bare = torch.cat([base(input_ids=ids[:, s : s + SEGMENT]).logits for s in range(0, ids.shape[1], SEGMENT)], 1)
    layers = layer_overrides(method, family)
    try:
        model = ha.wrap_with_memory(base, method, segment_length=SEGMENT, **METHOD_CASES[method], **layers).eval()
    except NotImplementedError as err:
        reason = str(err).split(" does not support: ", 1)[-1].split(". Methods that work", 1)[0]
        return {"outcome": "refused", "reason": reason}
    with torch.no_grad(), model.disable_memory():
        diff = float((model(input_ids=ids).logits - bare).abs().max())
    result = {"outcome": "yes" if diff <= TOLERANCE else "wrong", "max_abs_diff_disabled_memory": diff}
    return {**result, "memory_layers": layers} if layers else result


def main() -> None:
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(1)
    cells, classes, reads = {}, {}, {}
    for family in FAMILY_NAMES:
        classes[family] = type(family_backbone(family)).__name__
        for method in METHOD_CASES:
            cells[f"{method}/{family}"] = cell(method, family)
        reads[family] = memory_reads(family, cells[f"transformer_xl/{family}"]["outcome"] == "refused")
        print(family, " ".join(cells[f"{m}/{family}"]["outcome"] for m in METHOD_CASES), reads[family], flush=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    result = {
        "command": "python tools/support_matrix.py",
        "transformers": transformers.__version__,
        "methods": list(METHOD_CASES),
        "families": classes,
        "cells": cells,
        "memory_reads": reads,
        "provenance": {"git_commit": commit, "torch": torch.__version__, "time": time.strftime("%Y-%m-%d %H:%M:%S")},
    }
    RESULT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
