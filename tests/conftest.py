"""Test environment: offline hubs, a private HF cache, deterministic CPU threads."""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hmt-adapters-hf-"))

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny test models are dominated by per-op overhead: one thread is fastest, and robust when cores are shared.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
