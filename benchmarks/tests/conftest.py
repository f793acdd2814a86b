"""The lab's tests: the scripts of benchmarks/ importable by name, beside the library's test helpers (tests/tiny.py,
tests/cases.py) and its environment (tests/environment.py); a fixed seed."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]

import pytest  # noqa: E402
import torch  # noqa: E402

import environment  # noqa: E402, F401  (sets the environment on import)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
