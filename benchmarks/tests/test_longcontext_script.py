"""benchmarks/longcontext.py: its command line, its README section, and that it runs without the optional lm-eval."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import hmt_adapters as ha
from hmt_adapters.evaluation import accuracy_table, answer_rows, make_samples
from hmt_adapters.evaluation.zero_shot import zero_shot_readers
from tiny import tiny_llama, tiny_tokenizer


def test_benchmark_command_line_refuses_an_unknown_method_naming_the_allowed_ones(capsys):
    from longcontext import build_parser

    args = build_parser().parse_args(["--methods", "hmt", "trams", "--memory", "cover", "trams=preset"])
    assert args.methods == ["hmt", "trams"] and args.memory == ["cover", "trams=preset"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--methods", "xl"])
    err = capsys.readouterr().err
    assert "invalid choice: 'xl'" in err and all(m in err for m in ha.available_methods())


def test_readme_section_lists_every_reader_its_store_and_seconds_per_prompt():
    from longcontext import readme_section

    tok = tiny_tokenizer()
    readers, info = zero_shot_readers(
        tiny_llama(len(tok)), ["memorizing_transformer", "rmt"], segment_length=32, memory="cover", cover=160
    )
    rows = answer_rows(readers, make_samples("passkey", tok, 160, 2, haystack="repeat"), tok, progress=False)
    rows[0]["seconds"], rows[2]["seconds"] = 1.0, 3.0  # memorizing's two samples: mean 2.0
    data = {
        "command": "benchmarks/longcontext.py --methods memorizing_transformer rmt",
        "context": 4096,
        "window": 32,
        "readers": [r.name for r in readers],
        "rows": rows,
        "table": accuracy_table(rows),
        "zero_shot": {"memory": "cover", "readers": info},
    }
    text = readme_section(data, "x")
    accuracy = data["table"]["passkey"]["rmt (zero-shot)"]["160"]["accuracy"]
    assert f"| `rmt (zero-shot)` | {accuracy:.2f} (2) |" in text
    assert "| `memorizing_transformer (zero-shot)` | 2.0 |" in text
    assert "- `memorizing_transformer (zero-shot)`: cover store, segment 32, memory_size 160;" in text
    assert "- `rmt (zero-shot)`: cover store, segment 32, num_memory_tokens 1; untrained:" in text


def test_the_long_context_benchmark_runs_without_the_optional_lm_eval():
    """lm-eval is the `eval` extra: `benchmarks/longcontext.py` (and the evaluation it runs) must import without it,
    as on a machine that has only the core dependencies (it failed there at import before)."""
    root = Path(__file__).resolve().parents[2]
    code = "import sys; sys.modules['lm_eval'] = None; sys.path.insert(0, 'benchmarks'); import longcontext"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
