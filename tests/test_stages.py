"""Multi-stage BPTT in one call: stage 1 without retrieval, stage 2 with it from stage 1's weights; the curriculum."""

from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from datasets import Dataset
from safetensors.torch import load_file
from transformers import TrainerCallback

import hmt_adapters as ha
from hmt_adapters.config import MemoryConfig
from hmt_adapters.training import Stage, add_lora, hmt_stages, segment_curriculum, train_stages
from tiny import random_ids, tiny_backbone

SEGMENT = 8
ARGS = dict(
    per_device_train_batch_size=2,
    learning_rate=1e-2,
    logging_steps=1,
    use_cpu=True,
    disable_tqdm=True,
    save_strategy="no",
)


class Recorder(TrainerCallback):
    """Remembers, at the start of each stage, the window length and the memory prompt it starts from."""

    def __init__(self):
        self.starts = []
        self.steps = 0

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        self.starts.append((len(train_dataloader.dataset[0]["input_ids"]), model.memory.memory_init.detach().clone()))

    def on_step_end(self, args, state, control, **kwargs):
        self.steps += 1


def documents(n: int = 4, length: int = 70) -> Dataset:
    return Dataset.from_dict({"input_ids": random_ids(n, length).tolist()})


def lora_hmt(**switches) -> ha.MemoryModel:
    """A tiny LoRA + HMT model shaped for HMT's stage 1 (no retrieval)."""
    return ha.wrap_with_memory(
        add_lora(tiny_backbone("llama"), dropout=0.0),
        "hmt",
        segment_length=SEGMENT,
        sensory_length=2,
        memory_window=4,
        use_retrieval=False,
        **switches,
    )


def test_two_stages_hand_stage_one_weights_to_stage_two_with_retrieval(tmp_path):
    model = lora_hmt(offload_activations=True)
    recorder = Recorder()
    final = train_stages(
        model,
        hmt_stages(stage1_steps=2, stage2_steps=1, stage2_segments=3),
        documents(),
        str(tmp_path),
        training_args=ARGS,
        eval_documents=documents(2),
        callbacks=[recorder],
    )
    assert final.memory_config.use_retrieval and final is not model
    assert final.memory_config.offload_activations  # a runtime switch: not in the saved adapter, kept by the reload
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
        (
            lambda m, d, o: train_stages(m, [Stage(2, 1, config={"bogus": 1})], d, o),
            ValueError,
            "unknown config fields",
        ),
        (
            lambda m, d, o: train_stages(m, [Stage(2, 1)], d, o, deepspeed=f"{o}.json"),
            FileNotFoundError,
            "does not exist",
        ),
        (lambda m, d, o: Stage(2, 1, min_segments=3), ValueError, r"min_segments` must be in \[1, n_segments=2\]"),
        (
            lambda m, d, o: train_stages(m, [Stage(2, 1), Stage(4, 1)], d, o, stride_segments=3),
            ValueError,
            r"\[1, 2\]",
        ),
    ],
)
def test_bad_stage_input_is_a_clear_error_before_anything_is_written(tmp_path, call, error, message):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "hmt", segment_length=SEGMENT, memory_window=4)
    out = str(tmp_path / "run")
    with pytest.raises(error, match=message):
        call(model, documents(), out)
    assert not os.path.exists(out)


class FirstBatch(TrainerCallback):
    """Keeps the first training batch each stage's dataloader yields."""

    def __init__(self):
        self.batches = []

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        self.batches.append(next(iter(train_dataloader)))


def test_paper_protocol_last_segment_loss_on_stride_windows_logs_the_real_depths(tmp_path, caplog):
    model = ha.wrap_with_memory(tiny_backbone("llama"), "rmt", segment_length=SEGMENT)
    first = FirstBatch()
    with caplog.at_level(logging.INFO, logger="hmt_adapters.training.stages"):
        train_stages(
            model,
            [Stage(3, 1, min_segments=2)],
            documents(4, 70),
            str(tmp_path),
            training_args=ARGS,
            callbacks=[first],
            loss_segments=1,
            stride_segments=1,
        )
    # 70 tokens, windows ending every 8: 8 (dropped, 1 segment), 16, 24, then 24 each and a last one of 22 tokens
    assert (
        "32 windows, 3 segments asked, depth min/median/max 2/3/3, 4 (12.5%) shorter; loss on the last 1 segment(s)"
    ) in caplog.text
    batch = first.batches[0]
    for ids, labels, mask in zip(batch["input_ids"], batch["labels"], batch["attention_mask"]):
        n = int(mask.sum())
        start = (-(-n // SEGMENT) - 1) * SEGMENT + 1
        assert (labels[:start] == -100).all() and labels[start:n].equal(ids[start:n])


def trained_weights(model: ha.MemoryModel) -> dict:
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_a_run_cut_off_in_stage_two_resumes_to_the_same_weights_as_a_straight_run(tmp_path):
    stages = hmt_stages(stage1_steps=2, stage2_steps=3, stage2_segments=3)
    args = {**ARGS, "save_strategy": "steps", "save_steps": 1, "seed": 0}
    straight = train_stages(lora_hmt(), stages, documents(), str(tmp_path / "a"), training_args=args)
    # what a run killed after stage 2's first step leaves: stage 1 finished, stage 2 with one checkpoint
    cut = tmp_path / "b"
    shutil.copytree(tmp_path / "a" / "stage1", cut / "stage1")
    shutil.copytree(tmp_path / "a" / "stage2" / "checkpoint-1", cut / "stage2" / "checkpoint-1")
    recorder = Recorder()
    resumed = train_stages(
        lora_hmt(), stages, documents(), str(cut), training_args=args, callbacks=[recorder], resume=True
    )
    assert [n for n, _ in recorder.starts] == [3 * SEGMENT]  # stage 1 not trained again
    assert recorder.steps == 2  # stage 2 continued from its checkpoint, not from its start
    assert resumed.memory_config.use_retrieval
    expected, got = trained_weights(straight), trained_weights(resumed)
    assert set(got) == set(expected) and any("lora" in k for k in got)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=1e-5, msg=name)
    losses = [
        [h["loss"] for h in json.load(open(run / "stage2" / "trainer_state.json"))["log_history"] if "loss" in h]
        for run in (tmp_path / "a", cut)
    ]
    # step 1 comes from the checkpoint's state; steps 2 and 3 were computed again, the same as the straight run's
    assert len(losses[1]) == 3 and losses[1] == pytest.approx(losses[0], abs=1e-6)


def test_resuming_a_finished_run_trains_nothing_and_returns_its_last_adapter(tmp_path):
    stages = hmt_stages(stage1_steps=1, stage2_steps=1, stage2_segments=3)
    trained = train_stages(lora_hmt(), stages, documents(), str(tmp_path), training_args=ARGS)
    recorder = Recorder()
    again = train_stages(
        lora_hmt(), stages, documents(), str(tmp_path), training_args=ARGS, callbacks=[recorder], resume=True
    )
    assert recorder.starts == [] and recorder.steps == 0 and again.memory_config.use_retrieval
    expected, got = trained_weights(trained), trained_weights(again)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=0, rtol=0, msg=name)
    longer = hmt_stages(stage1_steps=1, stage2_steps=2, stage2_segments=3)
    with pytest.raises(ValueError, match=r"Stage 'stage2' finished at step 1 .* max_steps=2"):
        train_stages(lora_hmt(), longer, documents(), str(tmp_path), training_args=ARGS, resume=True)
