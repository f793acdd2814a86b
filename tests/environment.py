"""The test environment, set before anything imports transformers: offline hubs, a private HF cache, one CPU thread
(tiny test models are dominated by per-op overhead: one thread is fastest, and robust when cores are shared). The
library's tests and the lab's both start with it (each from its own conftest.py)."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hmt-adapters-hf-"))

import torch  # noqa: E402

torch.set_num_threads(1)
