"""DeepSpeed ZeRO-2 through `TrainingArguments(deepspeed=...)`: 2 CPU processes (gloo, torchrun), the shipped
config."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from hmt_adapters.training import DEEPSPEED_CONFIGS, deepspeed_config

WORKER = os.path.join(os.path.dirname(__file__), "zero2_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_zero2_on_two_processes_keeps_ranks_identical_writes_adapter_only_and_resumes(tmp_path):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        WORKER,
        str(tmp_path),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in (0, 1)]
    assert any(k.startswith("memory.") for k in ranks[0]) and any("lora_" in k for k in ranks[0])
    for name, value in ranks[0].items():
        assert torch.equal(value, ranks[1][name]), f"{name} differs between ranks"
    resumed = load_file(tmp_path / "rank0-resumed.safetensors")
    for name, value in ranks[0].items():
        torch.testing.assert_close(resumed[name], value, atol=1e-6, rtol=1e-5)
    losses = json.loads((tmp_path / "rank0-losses.json").read_text())
    assert losses["resumed"][-1] == pytest.approx(losses["straight"][-1], abs=1e-6)

    engine_state = torch.load(
        tmp_path / "straight" / "checkpoint-2" / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False
    )
    assert set(engine_state["module"]) == set(ranks[0]), (
        "the DeepSpeed checkpoint must hold only the trainable weights"
    )
    assert engine_state["frozen_param_fragments"] is None


def test_shipped_configs_are_package_files_and_bad_paths_are_clear_errors(tmp_path):
    for name in DEEPSPEED_CONFIGS:
        config = json.load(open(deepspeed_config(name)))
        assert config["zero_optimization"]["stage"] == 2
    assert "offload_optimizer" in json.load(open(deepspeed_config("zero2_offload")))["zero_optimization"]
    with pytest.raises(FileNotFoundError, match="does not exist.*zero2"):
        deepspeed_config(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        deepspeed_config(tmp_path / "bad.json")
