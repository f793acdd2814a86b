"""`MemoryTrainer`: the HF `Trainer` with adapter-only DeepSpeed engine checkpoints.

The plain `Trainer` already trains, checkpoints, resumes and saves a `MemoryModel` (adapter files only). Under
DeepSpeed, though, it asks the engine to leave frozen weights out of its checkpoint only for peft models, so for a
`MemoryModel` every `checkpoint-<step>/global_step<step>/` would hold the whole frozen backbone (twice under ZeRO-2:
in the module state and as "frozen fragments"). Even with `exclude_frozen_parameters=True` the engine keeps the
aliases of tied frozen weights (e.g. a tied `lm_head.weight`). `MemoryTrainer` writes engine checkpoints with the
trainable entries only; resuming works because `MemoryModel.load_state_dict` accepts state dicts without the backbone.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from transformers import Trainer

from ..saving.checkpoint import trainable_keys


@contextlib.contextmanager
def _adapter_only_checkpoints(engine, keep: set[str]) -> Iterator[None]:
    """Inside: `engine.save_checkpoint` writes no frozen fragments and only the `keep` entries of the module state."""
    cls = type(engine)
    engine.save_checkpoint = functools.partial(cls.save_checkpoint, engine, exclude_frozen_parameters=True)
    engine.module_state_dict = lambda *args, **kwargs: {
        k: v for k, v in cls.module_state_dict(engine, *args, **kwargs).items() if k in keep
    }
    try:
        yield
    finally:
        del engine.save_checkpoint, engine.module_state_dict


class MemoryTrainer(Trainer):
    """A `transformers.Trainer` whose DeepSpeed checkpoints hold only the trainable weights and optimizer state."""

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self.is_deepspeed_enabled:
            return super()._save_optimizer_and_scheduler(output_dir)
        with _adapter_only_checkpoints(self.model_wrapped, trainable_keys(self.model)):  # type: ignore[arg-type]
            super()._save_optimizer_and_scheduler(output_dir)
