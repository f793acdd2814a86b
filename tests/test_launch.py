"""Launching `examples/train_hmt.py` on N processes: the documented torchrun and accelerate commands really start N
(counted by an all-reduce inside the first training step), and a launch with fewer processes than asked is an error."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hmt_adapters.training.launch import ACCELERATE_CONFIGS, accelerate_config, check_launch
from launch_fixture import write_documents, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "examples" / "train_hmt.py")
TINY_RUN = [
    "--segment-length",
    "16",
    "--sensory-length",
    "4",
    "--memory-window",
    "4",
    "--stage1-steps",
    "1",
    "--stage2-steps",
    "1",
    "--stage2-segments",
    "3",
    "--batch-size",
    "1",
    "--eval-tokens",
    "64",
    "--save-steps",
    "100",
    "--loss-segments",
    "1",
    "--stride-segments",
    "1",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launchers(port: int) -> dict[str, list[str]]:
    """The commands docs/training.md documents, with a free port."""
    bin_dir = Path(sys.executable).parent
    return {
        "python": [sys.executable],  # one process, no launcher
        "torchrun": [str(bin_dir / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port)],
        "accelerate": [
            str(bin_dir / "accelerate"),
            "launch",
            "--config_file",
            accelerate_config("multi_process"),
            "--num_processes",
            "2",
            "--main_process_port",
            str(port),
        ],
        "accelerate --cpu": [
            str(bin_dir / "accelerate"),
            "launch",
            "--cpu",
            "--num_processes",
            "2",
            "--main_process_port",
            str(port),
        ],
    }


def run_example(launcher: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """examples/train_hmt.py's tiny run under `launcher`, with `extra` arguments after the tiny run's."""
    if not (tmp_path / "model").is_dir():
        texts = write_documents(tmp_path / "docs")
        write_tiny_model(tmp_path / "model", texts)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = launchers(free_port())[launcher] + [
        SCRIPT,
        "--model",
        str(tmp_path / "model"),
        "--corpus",
        str(tmp_path / "docs"),
        "--output",
        str(tmp_path / "run"),
        *TINY_RUN,
        *extra,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["torchrun", "accelerate"])
def test_documented_launch_commands_run_two_processes_inside_the_training_step(launcher, tmp_path):
    run = run_example(launcher, tmp_path)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    seen = re.findall(r"training step 1 ran on (\d+) process\(es\) \(this is rank (\d)\)", log)
    assert sorted(seen) == sorted([("2", "0"), ("2", "1")] * 2), seen  # both ranks, in both stages
    assert (tmp_path / "run" / "stage2" / "memory_adapter.safetensors").is_file()


@pytest.mark.slow
def test_accelerate_cpu_flag_starting_one_process_is_a_clear_error(tmp_path):
    run = run_example("accelerate --cpu", tmp_path)
    assert run.returncode != 0
    assert "started this script as a single process although several were asked" in run.stderr
    assert "ran on" not in run.stdout + run.stderr  # stopped before any training step


def test_check_launch_compares_the_asked_and_the_running_process_counts(monkeypatch):
    for name in ("WORLD_SIZE", "MASTER_ADDR", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    assert check_launch() == 1 and check_launch(2, world=2) == 2
    with pytest.raises(RuntimeError, match="2 processes were asked but 1 run.*torchrun --nproc_per_node"):
        check_launch(2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="2 processes were asked but 1 run"):
        check_launch()
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # what `accelerate launch --cpu --num_processes 2` leaves
    with pytest.raises(RuntimeError, match="single process although several were asked"):
        check_launch()
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ValueError, match="integer >= 1, got 0"):
        check_launch(0)


def test_shipped_accelerate_configs_are_package_files():
    import yaml

    kinds = {name: yaml.safe_load(open(accelerate_config(name)))["distributed_type"] for name in ACCELERATE_CONFIGS}
    assert kinds == {"multi_process": "MULTI_GPU", "deepspeed_zero2": "DEEPSPEED"}
    with pytest.raises(ValueError, match="Unknown accelerate config 'cpu'.*multi_process"):
        accelerate_config("cpu")


def test_the_lm_stages_train_armt_and_refuse_memory_tokens_it_does_not_have(tmp_path):
    """`--method armt` (one process): both stages train the associative memory and save its adapter; `--resume` of
    the finished run trains nothing; `--num-memory-tokens`, RMT's alone, is an error with it rather than ignored."""
    run = run_example("python", tmp_path, "--method", "armt")
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    config = (tmp_path / "run" / "stage2" / "memory_config.json").read_text()
    assert '"method": "armt"' in config and '"segment_length": 16' in config
    again = run_example("python", tmp_path, "--method", "armt", "--resume")  # the finished run: nothing to train
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-4000:]
    assert len(re.findall(r"Stage 'stage\d' finished in an earlier run", log)) == 2 and "training step 1" not in log
    refused = run_example("python", tmp_path, "--method", "armt", "--num-memory-tokens", "4")
    assert refused.returncode != 0 and "--num-memory-tokens sizes RMT's memory; --method armt" in refused.stderr


def test_stage_two_in_micro_batches_trains_the_same_weights(tmp_path):
    """`--stage2-accumulation 2`: stage 2 takes its batch of 2 in two micro-batches of 1 (half the activation memory of
    its longer windows) and ends with the weights of the one-batch run; a count that does not divide the batch is an
    error."""
    whole = run_example("python", tmp_path, "--batch-size", "2", "--output", str(tmp_path / "whole"))
    assert whole.returncode == 0, (whole.stdout + whole.stderr)[-4000:]
    split = run_example("python", tmp_path, "--batch-size", "2", "--stage2-accumulation", "2")
    assert split.returncode == 0, (split.stdout + split.stderr)[-4000:]
    args = torch.load(tmp_path / "run" / "stage2" / "training_args.bin", weights_only=False)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (1, 2)
    expected = load_file(tmp_path / "whole" / "stage2" / "memory_adapter.safetensors")
    got = load_file(tmp_path / "run" / "stage2" / "memory_adapter.safetensors")
    assert set(got) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=1e-4, msg=name)
    assert not torch.equal(
        expected["memory_init"], load_file(tmp_path / "whole" / "stage1" / "memory_adapter.safetensors")["memory_init"]
    )
    refused = run_example("python", tmp_path, "--batch-size", "2", "--stage2-accumulation", "3")
    assert refused.returncode != 0 and "--stage2-accumulation must be a divisor of --batch-size 2" in refused.stderr


def test_eval_steps_log_a_held_out_curve_per_stage(tmp_path):
    """`--eval-steps 1`: each stage evaluates the held-out loss after every step (a curve that shows a memory fitting
    its training text, where a stage-end number does not), and the summary names the lowest; 0 is an error."""
    run = run_example("python", tmp_path, "--stage1-steps", "2", "--eval-steps", "1")
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-4000:]
    history = json.loads((tmp_path / "run" / "stage1" / "trainer_state.json").read_text())["log_history"]
    assert sorted({h["step"] for h in history if "eval_loss" in h}) == [1, 2]
    assert re.search(
        r"stage1: held-out loss [\d.]+, perplexity [\d.]+ \(lowest [\d.]+, at step [12] of 2 evaluated\)", log
    )
    refused = run_example("python", tmp_path, "--eval-steps", "0")
    assert refused.returncode != 0 and "--eval-steps must be a positive number of steps, got 0" in refused.stderr
