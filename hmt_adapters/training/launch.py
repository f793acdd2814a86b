"""Multi-process launching that cannot silently shrink: shipped `accelerate launch` configs and a world-size check.

`accelerate launch --cpu --num_processes N` runs the script once: accelerate's CPU path is its single-process
launcher (`simple_launcher`), which only sets `MASTER_ADDR`/`MASTER_PORT`, and multi-process CPU there needs `mpirun`.
The shipped configs use accelerate's multi-process launcher (torch.distributed) instead, which starts N processes on
GPUs and on CPUs alike. `check_launch` and `LaunchReport` turn a launch with fewer processes than asked into an error.
"""

from __future__ import annotations

import logging
import os
from importlib import resources

import torch
import torch.distributed as dist
from transformers import TrainerCallback

logger = logging.getLogger(__name__)

ACCELERATE_CONFIGS = ("multi_process", "deepspeed_zero2")
FIX = (
    "Launch with `torchrun --nproc_per_node N script.py` or `accelerate launch --config_file "
    "$(python -m hmt_adapters.training.launch multi_process) --num_processes N script.py` (see docs/training.md)."
)


def accelerate_config(name: str) -> str:
    """The path of a shipped `accelerate launch --config_file` YAML (`"multi_process"`, `"deepspeed_zero2"`)."""
    if name not in ACCELERATE_CONFIGS:
        raise ValueError(f"Unknown accelerate config {name!r}; shipped: {list(ACCELERATE_CONFIGS)}.")
    return str(resources.files(__package__).joinpath("accelerate_configs", f"{name}.yaml"))


def world_size() -> int:
    """Processes in the running torch.distributed group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def check_launch(expected: int | None = None, world: int | None = None) -> int:
    """Raise when this run has fewer (or more) processes than asked; returns the process count.

    `expected` defaults to the launcher's `WORLD_SIZE`. A script started by `accelerate launch --cpu --num_processes N`
    (N > 1) is recognised by `MASTER_ADDR` without `WORLD_SIZE` and refused: it would train alone, silently.
    """
    env = os.environ
    world = world_size() if world is None else world
    if "ACCELERATE_USE_CPU" in env and "MASTER_ADDR" in env and "WORLD_SIZE" not in env:
        raise RuntimeError(
            "`accelerate launch` started this script as a single process although several were asked: its `--cpu` "
            f"launcher never starts more than one. {FIX}"
        )
    if expected is None:
        expected = int(env.get("WORLD_SIZE", "1"))
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise ValueError(f"`expected` processes must be an integer >= 1, got {expected!r}.")
    if world != expected:
        raise RuntimeError(f"{expected} processes were asked but {world} run in this training. {FIX}")
    return world


class LaunchReport(TrainerCallback):
    """Counts the processes that really run the first training step (an all-reduce inside it) and checks them."""

    def __init__(self, expected: int | None = None):
        self.expected = expected
        self.counted: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self.counted = None  # each stage's first step reports

    def on_step_end(self, args, state, control, **kwargs):
        if self.counted is not None:
            return
        ones = torch.ones((), device=args.device)
        if world_size() > 1:
            dist.all_reduce(ones)
        self.counted = int(ones.item())
        rank = dist.get_rank() if world_size() > 1 else 0
        logger.info("training step %d ran on %d process(es) (this is rank %d)", state.global_step, self.counted, rank)
        check_launch(self.expected, world=self.counted)


if __name__ == "__main__":  # `python -m hmt_adapters.training.launch NAME` prints a shipped config's path
    import sys

    print(accelerate_config(sys.argv[1] if len(sys.argv) > 1 else "multi_process"))
