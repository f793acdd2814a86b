"""Ready DeepSpeed configs for `TrainingArguments(deepspeed=...)`, shipped inside the package.

- `zero2`: ZeRO stage 2 (optimizer state and gradients sharded across processes), the HMT paper's setup
  (App. K); the `Trainer` builds AdamW and the LR schedule, every batch/clipping value is `"auto"`.
- `zero2_offload`: the same with the optimizer state and step on the CPU (DeepSpeed's CPU Adam).
"""

from __future__ import annotations

import os
from importlib import resources

from ..config import read_json_object

CONFIG_NAMES = ("zero2", "zero2_offload")


def deepspeed_config(name_or_path: str | os.PathLike) -> str:
    """The JSON path for a shipped config name (`"zero2"`, `"zero2_offload"`) or an existing config file.

    Checked before any training starts: a missing or unreadable file is a clear error, not a failure mid-run.
    """
    if name_or_path in CONFIG_NAMES:
        return str(resources.files(__package__).joinpath("deepspeed_configs", f"{name_or_path}.json"))
    path = os.fspath(name_or_path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"DeepSpeed config {path!r} does not exist; pass a JSON file or one of {list(CONFIG_NAMES)}."
        )
    read_json_object(path, "DeepSpeed config")
    return path
