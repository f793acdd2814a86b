"""`MemoryTrainer`: the HF `Trainer` with adapter-only DeepSpeed engine checkpoints.

The plain `Trainer` already trains, checkpoints, resumes and saves a `MemoryModel` (adapter files only). Under
DeepSpeed, though, it asks the engine to leave frozen weights out of its checkpoint only for peft models, so for a
`MemoryModel` every `checkpoint-<step>/global_step<step>/` would hold the whole frozen backbone (twice under ZeRO-2:
in the module state and as "frozen fragments"). `MemoryTrainer` passes `exclude_frozen_parameters=True`; resuming
works because `MemoryModel.load_state_dict` accepts state dicts without the frozen backbone.
"""

from __future__ import annotations

import functools

from transformers import Trainer


class MemoryTrainer(Trainer):
    """A `transformers.Trainer` whose DeepSpeed checkpoints hold only the trainable weights and optimizer state."""

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self.is_deepspeed_enabled:
            return super()._save_optimizer_and_scheduler(output_dir)
        engine = self.model_wrapped
        engine.save_checkpoint = functools.partial(type(engine).save_checkpoint, engine, exclude_frozen_parameters=True)
        try:
            super()._save_optimizer_and_scheduler(output_dir)
        finally:
            del engine.save_checkpoint
