"""Multi-stage BPTT in one call: stage 1 without retrieval, stage 2 with it from stage 1's weights; the curriculum."""

from __future__ import annotations

import json
import os

import pytest
from datasets import Dataset
from safetensors.torch import load_file
from transformers import TrainerCallback

import hmt_adapters as ha
from hmt_adapters.config import MemoryConfig
from hmt_adapters.training import Stage, add_lora, hmt_stages, segment_curriculum, train_stages
from tiny import random_ids, tiny_backbone

SEGMENT = 8
ARGS = dict(per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1, use_cpu=True, disable_tqdm=True,
            save_strategy="no")


class Recorder(TrainerCallback):
    """Remembers, at the start of each stage, the window length and the memory prompt it starts from."""

    def __init__(self):
        self.starts = []

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self.starts.append((len(train_dataloader.dataset[0]["input_ids"]), model.memory.memory_init.detach().clone()))


def documents(n: int = 4, length: int = 70) -> Dataset:
    return Dataset.from_dict({"input_ids": random_ids(n, length).tolist()})


def test_two_stages_hand_stage_one_weights_to_stage_two_with_retrieval(tmp_path):
    model = ha.wrap_with_memory(add_lora(tiny_backbone("llama"), dropout=0.0), "hmt", segment_length=SEGMENT,
                                sensory_length=2, memory_window=4, use_retrieval=False)
    recorder = Recorder()
    final = train_stages(model, hmt_stages(stage1_steps=2, stage2_steps=1, stage2_segments=3), documents(),
                         str(tmp_path), training_args=ARGS, eval_documents=documents(2), callbacks=[recorder])
    assert final.memory_config.use_retrieval and final is not model
    stage1 = MemoryConfig.from_json_file(tmp_path / "stage1" / "memory_config.json")
    assert stage1.use_retrieval is False
    assert "retrieval.key.weight" in load_file(tmp_path / "stage2" / "memory_adapter.safetensors")
    assert "adapter_model.safetensors" in os.listdir(tmp_path / "stage2")
    (len1, _), (len2, stage2_start) = recorder.starts
    assert (len1, len2) == (2 * SEGMENT, 3 * SEGMENT)
    trained_stage1 = load_file(tmp_path / "stage1" / "memory_adapter.safetensors")["memory_init"]
    assert stage2_start.equal(trained_stage1)
    history = json.load(open(tmp_path / "stage2" / "trainer_state.json"))["log_history"]
    assert any("eval_loss" in h for h in history) and sum("loss" in h for h in history) == 1


def test_curriculum_levels_grow_the_window_and_continue_the_same_model(tmp_path):
    stages = segment_curriculum((2, 3), steps_per_level=1)
    assert [(s.n_segments, s.name) for s in stages] == [(2, "level1-2seg"), (3, "level2-3seg")]
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=SEGMENT)
    recorder = Recorder()
    final = train_stages(model, stages, documents(), str(tmp_path), training_args=ARGS, callbacks=[recorder])
    assert final is model and [n for n, _ in recorder.starts] == [16, 24]


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m, d, o: segment_curriculum((4, 2), 1), ValueError, "increasing"),
        (lambda m, d, o: Stage(0, 5), ValueError, "n_segments"),
        (lambda m, d, o: train_stages(m, [], d, o), ValueError, "empty"),
        (lambda m, d, o: train_stages(m, hmt_stages(1, 1), d, o), ValueError, "first stage 'stage1' expects"),
        (lambda m, d, o: train_stages(m, [Stage(2, 1, config={"bogus": 1})], d, o), ValueError, "unknown config fields"),
        (lambda m, d, o: train_stages(m, [Stage(2, 1)], d, o, deepspeed=f"{o}.json"), FileNotFoundError, "does not exist"),
    ],
)
def test_bad_stage_input_is_a_clear_error_before_anything_is_written(tmp_path, call, error, message):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=SEGMENT, memory_window=4)
    out = str(tmp_path / "run")
    with pytest.raises(error, match=message):
        call(model, documents(), out)
    assert not os.path.exists(out)
