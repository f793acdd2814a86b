"""Multi-stage BPTT in one call (HMT App. F) and the segment-count curriculum (2 -> 4 -> 8 ...).

Each stage trains on windows of up to `n_segments` segments (BPTT through all of them) with a fresh `MemoryTrainer`
(fresh optimizer and schedule, as the HMT reference does between stages), saves its adapter into
`<output_dir>/<stage name>/`, and hands the trained weights to the next stage. A stage that changes the memory config
(HMT stage 2 turns retrieval on) reloads the previous adapter with `MemoryModel.from_pretrained(..., **config)`,
which initialises exactly the new weights. The paper's protocol (loss on the last segment, a window ending at every
segment) is `loss_segments=1, stride_segments=1`; each stage logs the depth its windows really have.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from datasets import Dataset
from transformers import TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from ..data import WindowCollator, make_windows
from ..data.windows import depth_summary
from ..model import MemoryModel
from .deepspeed import deepspeed_config
from .trainer import MemoryTrainer

logger = logging.getLogger(__name__)

DEFAULT_ARGS = {"report_to": "none", "prediction_loss_only": True}


@dataclass
class Stage:
    """One training stage.

    Args:
        n_segments: segments per training window; gradients flow back through all of them (BPTT depth).
        max_steps: optimizer steps of this stage.
        min_segments: windows with fewer full segments are dropped (`n_segments`: full-depth windows only).
        name: folder name under the output directory (default `stage<i>-<n>seg`).
        config: memory-config changes this stage makes (e.g. `{"use_retrieval": True}`).
        training_args: `TrainingArguments` values for this stage only (e.g. `{"learning_rate": 1e-4}`).
    """

    n_segments: int
    max_steps: int
    name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    training_args: dict[str, Any] = field(default_factory=dict)
    min_segments: int = 1

    def __post_init__(self) -> None:
        for key in ("n_segments", "max_steps", "min_segments"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Stage `{key}` must be an integer >= 1, got {value!r}.")
        if self.min_segments > self.n_segments:
            raise ValueError(
                f"Stage `min_segments` must be in [1, n_segments={self.n_segments}], got {self.min_segments}."
            )


def hmt_stages(stage1_steps: int, stage2_steps: int, stage2_segments: int = 15, min_segments: int = 1) -> list[Stage]:
    """HMT's recipe: stage 1 without retrieval over 2 segments, stage 2 with retrieval over `stage2_segments` (15 in
    App. F).

    `min_segments` applies to both stages, capped at stage 1's 2 segments (pass `stage2_segments` for full depth).
    """
    return [
        Stage(2, stage1_steps, name="stage1", config={"use_retrieval": False}, min_segments=min(min_segments, 2)),
        Stage(stage2_segments, stage2_steps, name="stage2", config={"use_retrieval": True}, min_segments=min_segments),
    ]


def segment_curriculum(levels: Sequence[int], steps_per_level: int, **config: Any) -> list[Stage]:
    """One stage per segment count, e.g. `levels=(2, 4, 8)` (the HMT reference's curriculum); `config` applies to the
    first."""
    if not levels or list(levels) != sorted(levels):
        raise ValueError(f"`levels` must be a non-empty increasing list of segment counts, got {list(levels)!r}.")
    return [
        Stage(n, steps_per_level, name=f"level{i + 1}-{n}seg", config=config if i == 0 else {})
        for i, n in enumerate(levels)
    ]


def _check_first_stage(model: MemoryModel, stage: Stage) -> None:
    config = model.memory_config
    unknown = sorted(set(stage.config) - set(config.field_names()))
    if unknown:
        raise ValueError(
            f"Stage '{stage.name}' changes unknown config fields {unknown}; valid: {sorted(config.field_names())}."
        )
    differ = {k: v for k, v in stage.config.items() if getattr(config, k) != v}
    if differ:
        raise ValueError(
            f"The first stage '{stage.name}' expects {differ} but the model has "
            f"{ {k: getattr(config, k) for k in differ} }; wrap the backbone with the first stage's config."
        )


def _finished(stage: Stage, stage_dir: str) -> bool:
    """Whether `stage` already ran to its end in `stage_dir` (its adapter and trainer state saved); an error when the
    saved run stopped at another step count (a longer stage cannot continue a finished cosine schedule)."""
    path = os.path.join(stage_dir, "trainer_state.json")
    if not os.path.isfile(path):
        return False
    with open(path) as fh:
        done = json.load(fh)["global_step"]
    if done != stage.max_steps:
        raise ValueError(
            f"Stage '{stage.name}' finished at step {done} in {stage_dir}, but the stage asks max_steps="
            f"{stage.max_steps}; pass the same steps to resume, or a new output directory to train it again."
        )
    return True


def _stage_args(base: dict[str, Any], stage: Stage, output_dir: str, deepspeed: str | None) -> TrainingArguments:
    values = {**DEFAULT_ARGS, **base, **stage.training_args, "output_dir": output_dir, "max_steps": stage.max_steps}
    if deepspeed is not None:
        values["deepspeed"] = deepspeed
    return TrainingArguments(**values)


def train_stages(
    model: MemoryModel,
    stages: Sequence[Stage],
    train_documents: Dataset,
    output_dir: str,
    *,
    training_args: dict[str, Any] | None = None,
    eval_documents: Dataset | None = None,
    deepspeed: str | None = None,
    pad_token_id: int = 0,
    callbacks: Sequence[TrainerCallback] = (),
    loss_segments: int | None = None,
    stride_segments: int | None = None,
    resume: bool = False,
) -> MemoryModel:
    """Train `model` through `stages` and return the last stage's model; each stage's adapter lands in
    `output_dir/<name>`.

    `train_documents`/`eval_documents` are tokenized documents (an `input_ids` list per document, see
    `hmt_adapters.data.tokenize_documents`); each stage cuts them into windows of its own length. `training_args`
    are `TrainingArguments` values shared by all stages; `deepspeed` is a shipped config name or a JSON path.
    `loss_segments=k`: the loss (training and evaluation) covers only the predictions inside each window's last k
    segments. `stride_segments=s`: a window ends every s segments (default: windows tile without overlap).
    `resume=True`: finished stages in `output_dir` are loaded, not trained; a cut-off stage continues from its last
    checkpoint (save them with `save_steps`).
    """
    if not stages:
        raise ValueError("`stages` is empty; pass at least one Stage (see `hmt_stages`, `segment_curriculum`).")
    shortest = min(s.n_segments for s in stages)
    if stride_segments is not None and (
        isinstance(stride_segments, bool)
        or not isinstance(stride_segments, int)
        or not 1 <= stride_segments <= shortest
    ):
        raise ValueError(
            f"`stride_segments` must be None or an integer in [1, {shortest}] (the shortest stage's window: a longer "
            f"stride would skip tokens), got {stride_segments!r}."
        )
    stages = [s if s.name else replace(s, name=f"stage{i + 1}-{s.n_segments}seg") for i, s in enumerate(stages)]
    names = [s.name for s in stages]
    if len(set(names)) != len(names):
        raise ValueError(f"Stage names must be distinct, got {names}.")
    _check_first_stage(model, stages[0])
    ds_config = deepspeed_config(deepspeed) if deepspeed is not None else None
    segment_length = model.memory_config.segment_length
    collator = WindowCollator(
        pad_token_id=pad_token_id,
        min_length=segment_length,
        loss_segments=loss_segments,
        segment_length=segment_length,
    )
    previous_dir: str | None = None
    on_disk = False  # the previous stage finished in an earlier run: its weights are not in `model` yet
    for stage in stages:
        stage_dir = os.path.join(output_dir, stage.name)
        if resume and _finished(stage, stage_dir):
            logger.info("Stage '%s' finished in an earlier run: its adapter in %s is kept", stage.name, stage_dir)
            previous_dir, on_disk = stage_dir, True
            continue
        if previous_dir is not None and (stage.config or on_disk):
            model = _reload(model, previous_dir, stage.config)
        on_disk = False
        windows: dict[str, Any] = dict(
            segment_length=segment_length,
            n_segments=stage.n_segments,
            min_segments=stage.min_segments,
            stride=None if stride_segments is None else stride_segments * segment_length,
        )
        train = make_windows(train_documents, **windows)
        evaluation = make_windows(eval_documents, **windows) if eval_documents is not None else None
        logger.info(
            "Stage '%s': %s; loss on %s; %d steps",
            stage.name,
            depth_summary(train, segment_length, stage.n_segments),
            "every segment" if loss_segments is None else f"the last {loss_segments} segment(s)",
            stage.max_steps,
        )
        trainer = MemoryTrainer(
            model=model,
            args=_stage_args(training_args or {}, stage, stage_dir, ds_config),
            train_dataset=train,
            eval_dataset=evaluation,
            data_collator=collator,
            callbacks=list(callbacks),
        )
        checkpoint = get_last_checkpoint(stage_dir) if resume and os.path.isdir(stage_dir) else None
        if checkpoint is not None:
            logger.info("Stage '%s' continues from %s", stage.name, checkpoint)
        trainer.train(resume_from_checkpoint=checkpoint)
        state = trainer.state
        if evaluation is not None and not any(  # the last step's evaluation, unless `eval_steps` already ran it
            h.get("step") == state.global_step and "eval_loss" in h for h in state.log_history
        ):
            trainer.evaluate()
        trainer.save_model()
        trainer.save_state()
        trainer.accelerator.wait_for_everyone()  # other ranks read the adapter rank 0 just wrote
        previous_dir = stage_dir
    return _reload(model, previous_dir, {}) if on_disk and previous_dir is not None else model


def _reload(model: MemoryModel, adapter_dir: str, config: dict[str, Any]) -> MemoryModel:
    """`model`'s backbone with the adapter saved in `adapter_dir` (changed by `config`), trainable, its runtime
    switches kept (they are not in the saved adapter)."""
    switches = {k: getattr(model.memory_config, k) for k in model.memory_config.runtime_switches()}
    return MemoryModel.from_pretrained(
        model.backbone, adapter_dir, is_trainable=True, inplace=True, **{**switches, **config}
    )
