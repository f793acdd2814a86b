"""Test environment (tests/environment.py: offline hubs, a private HF cache, one CPU thread) and a fixed seed."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import pytest  # noqa: E402
import torch  # noqa: E402

import environment  # noqa: E402, F401  (sets the environment on import)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
