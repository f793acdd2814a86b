"""One rank of the 2-process DeepSpeed ZeRO-2 test (launched by tests/test_deepspeed.py through torchrun).

Trains a tiny HMT + LoRA model for three steps with `MemoryTrainer` and the shipped `zero2` config (each rank on its
own data shard, a checkpoint after step 2), then resumes a second run from that checkpoint for the last step. Writes
each rank's trainable weights of both runs and the logged losses under `<out>`.
"""

from __future__ import annotations

import json
import os
import sys

import deepspeed.ops

# The shared-memory all-reduce kernel only speeds up CPU collectives and costs a ~60 s JIT build; gloo does the
# same job.
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import TrainingArguments  # noqa: E402

import hmt_adapters as ha  # noqa: E402
from hmt_adapters.data import WindowCollator  # noqa: E402
from hmt_adapters.training import MemoryTrainer, add_lora, deepspeed_config  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from tiny import random_ids, tiny_backbone  # noqa: E402


def train(out: str, resume: str | None = None) -> tuple[list[float], dict[str, torch.Tensor], int]:
    """Three ZeRO-2 steps (checkpoint after two), or the last one resumed from that checkpoint."""
    model = ha.wrap_with_memory(
        add_lora(tiny_backbone("llama", tie_word_embeddings=True), dropout=0.0),
        "hmt",
        segment_length=8,
        sensory_length=2,
        memory_window=4,
    )
    data = Dataset.from_dict({"input_ids": random_ids(12, 24).tolist()})
    args = TrainingArguments(
        out,
        max_steps=3,
        save_steps=2,
        logging_steps=1,
        per_device_train_batch_size=1,
        learning_rate=1e-2,
        use_cpu=True,
        deepspeed=deepspeed_config("zero2"),
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = MemoryTrainer(model=model, args=args, train_dataset=data, data_collator=WindowCollator())
    trainer.train(resume_from_checkpoint=resume)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    weights = {n: p.detach().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    return losses, weights, trainer.args.process_index


def main(out: str) -> None:
    torch.set_num_threads(1)
    losses, weights, rank = train(os.path.join(out, "straight"))
    resumed_losses, resumed, _ = train(os.path.join(out, "resumed"), os.path.join(out, "straight", "checkpoint-2"))
    save_file(weights, os.path.join(out, f"rank{rank}.safetensors"))
    save_file(resumed, os.path.join(out, f"rank{rank}-resumed.safetensors"))
    with open(os.path.join(out, f"rank{rank}-losses.json"), "w") as fh:
        json.dump({"straight": losses, "resumed": resumed_losses}, fh)


if __name__ == "__main__":
    main(sys.argv[1])
    # gloo's threads torn down by the interpreter at exit aborted a rank once on a loaded machine ("terminate called
    # without an active exception", SIGABRT after both runs had finished): destroy the group first, as torch asks
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
