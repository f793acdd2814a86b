"""Inputs and files a user may get wrong: attention masks follow transformers' rule (any nonzero attends), NaN/Inf in
loaded weights or states are refused naming the tensor, and re-saving into a folder swaps it whole (a kill mid-save
leaves one complete adapter, the next save removes the staging folders it left)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_file

import hmt_adapters as ha
from tiny import random_ids, tiny_backbone

ROOT = Path(__file__).resolve().parents[1]
HMT = dict(segment_length=8, sensory_length=2, memory_window=4)


@pytest.mark.parametrize("value", [2, 0.5, -1, True])
def test_any_nonzero_mask_value_attends_as_in_transformers(value):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", **HMT).eval()
    ids = random_ids(2, 21, seed=1)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    odd = mask.to(torch.float if isinstance(value, float) else torch.long) * value
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, labels=ids)
        got = model(input_ids=ids, attention_mask=odd.to(torch.bool) if value is True else odd, labels=ids)
        torch.testing.assert_close(got.logits, expected.logits, atol=0, rtol=0)
        torch.testing.assert_close(got.loss, expected.loss, atol=0, rtol=0)
        _, state = model.step(ids, attention_mask=odd)
        _, reference = model.step(ids, attention_mask=mask)
    assert all(torch.equal(state.tensors[k], reference.tensors[k]) for k in state.tensors)


def test_nan_in_adapter_weights_peft_weights_or_a_state_is_refused_naming_the_tensor(tmp_path):
    base = get_peft_model(tiny_backbone("llama"), LoraConfig(target_modules=["q_proj"]))
    model = ha.wrap_with_memory(base, "hmt", **HMT)
    model.save_pretrained(tmp_path / "a")
    weights = load_file(tmp_path / "a" / "memory_adapter.safetensors")
    name = sorted(weights)[0]
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, tmp_path / "a" / "memory_adapter.safetensors", metadata={"format": "pt", "method": "hmt"})
    with pytest.raises(ValueError, match=f"tensor '{name}' holds 1 NaN or infinite"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path / "a")
    model.save_pretrained(tmp_path / "b")
    lora = load_file(tmp_path / "b" / "adapter_model.safetensors")
    key = sorted(lora)[0]
    lora[key].view(-1)[0] = float("inf")
    save_file(lora, tmp_path / "b" / "adapter_model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=f"peft weights .* tensor '{key}' holds"):
        ha.MemoryModel.from_pretrained(tiny_backbone("llama"), tmp_path / "b")
    _, state = model.step(random_ids(1, 9))
    state.tensors = {k: v.detach().clone() for k, v in state.tensors.items()}
    field = sorted(state.tensors)[0]
    state.tensors[field].view(-1)[0] = float("nan")
    state.save(tmp_path / "state.safetensors")
    with pytest.raises(ValueError, match=f"tensor '{field}' holds 1 NaN"):
        ha.MemoryState.load(tmp_path / "state.safetensors")


def test_the_next_save_removes_staging_folders_a_killed_save_left(tmp_path):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8)
    model.save_pretrained(tmp_path / "adapter")
    for leftover in (".adapter.tmp-abc123", ".adapter.tmp-def456.old"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "memory_adapter.safetensors").write_bytes(b"x" * 100)
    (tmp_path / ".other.tmp-keep").mkdir()  # another folder's staging area is not ours to remove
    model.save_pretrained(tmp_path / "adapter")
    assert sorted(os.listdir(tmp_path)) == [".other.tmp-keep", "adapter"]


def saver_models() -> list[ha.MemoryModel]:
    """Two RMT adapters whose weights differ in shape (1 and 3 memory tokens) and in value."""
    models = [
        ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=8, num_memory_tokens=n) for n in (1, 3)
    ]
    for n, model in enumerate(models):
        torch.manual_seed(n)
        with torch.no_grad():
            for p in model.memory_parameters():
                p.normal_()
    return models


SAVER = """
import sys
sys.path.insert(0, {tests!r})
from test_inputs_and_files import saver_models
models = saver_models()
models[0].save_pretrained({folder!r})
print("ready", flush=True)
while True:
    for m in models:
        m.save_pretrained({folder!r})
"""


def test_a_kill_during_a_re_save_leaves_one_complete_adapter(tmp_path):
    """Two adapters of different shapes saved in turn into one folder, the saver killed (SIGKILL) at random moments:
    each time the folder loads without error and holds exactly one of the two adapters."""
    folder = tmp_path / "adapter"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = SAVER.format(tests=str(ROOT / "tests"), folder=str(folder))
    expected = {m.memory_config.num_memory_tokens: m.memory.state_dict() for m in saver_models()}
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.15 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), folder)
        weights = expected[loaded.memory_config.num_memory_tokens]
        assert all(torch.equal(v, weights[k]) for k, v in loaded.memory.state_dict().items())


def test_an_interrupted_re_save_changes_the_folder_in_one_step(tmp_path, monkeypatch):
    """Interrupt the save at its second rename (where a file-by-file move would have moved the weights but not the
    config): the folder still loads as one whole adapter, the old or the new."""
    old, new = saver_models()
    folder = tmp_path / "adapter"
    old.save_pretrained(folder)
    calls = []

    def interrupted(real):
        def rename(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        return rename

    monkeypatch.setattr(os, "replace", interrupted(os.replace))
    monkeypatch.setattr(os, "rename", interrupted(os.rename))
    try:
        new.save_pretrained(folder)
    except KeyboardInterrupt:
        pass
    monkeypatch.undo()
    loaded = ha.MemoryModel.from_pretrained(tiny_backbone("llama"), folder)
    source = {1: old, 3: new}[loaded.memory_config.num_memory_tokens]
    assert all(torch.equal(v, source.memory.state_dict()[k]) for k, v in loaded.memory.state_dict().items())


def test_a_saved_adapter_is_as_readable_as_files_the_user_writes(tmp_path):
    """The staging folder (`mkdtemp`: 0700) and safetensors' files (0600) get the modes a plain `open`/`mkdir` gives
    under the process umask, as transformers' own saves have."""
    old = os.umask(0o022)
    try:
        ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=8).save_pretrained(tmp_path / "adapter")
    finally:
        os.umask(old)
    folder = tmp_path / "adapter"
    assert os.stat(folder).st_mode & 0o777 == 0o755
    assert {p.name: os.stat(p).st_mode & 0o777 for p in folder.iterdir()} == {
        "config.json": 0o644,
        "memory_config.json": 0o644,
        "memory_adapter.safetensors": 0o644,
    }
