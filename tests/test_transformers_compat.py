"""The installed transformers, whichever supported release it is: no deprecation warnings, both cache names.

transformers 5.24 renamed the cache keyword (`past_key_values`/`cache_params` -> `cache`) and broke every `generate`
of this package (docs/development.md, "Upgrading transformers"). These tests run against the installed release, so
the version matrix (`tools/version_matrix.py`) runs them on every release from the floor to the newest.
"""

from __future__ import annotations

import logging
import tomllib
import warnings
from pathlib import Path

import pytest
import torch

import hmt_adapters as ha
from cases import METHOD_CASES, SEGMENT, families_for, wrap
from hmt_adapters import compat
from hmt_adapters.runtime.generation import MemoryGenerationCache
from hmt_adapters.training import add_lora
from tiny import random_ids, tiny_backbone

GREEDY = dict(do_sample=False, pad_token_id=0, max_new_tokens=SEGMENT + 2, min_new_tokens=SEGMENT + 2)


def every_verb(model: ha.MemoryModel, family: str, folder) -> None:
    """wrap's product through forward, step, generate (both cache paths), save and load."""
    ids = random_ids(2, 2 * SEGMENT + 3)
    loss = model(input_ids=ids, labels=ids).loss
    if loss.requires_grad:  # a method with no trainable part on a frozen backbone has nothing to train
        loss.backward()
    model.eval()
    with torch.no_grad():
        _, state = model.step(ids[:, : SEGMENT + 1])
        model.step(ids[:, SEGMENT + 1 :], state)
    model.generate(input_ids=ids, **GREEDY)
    model.generate(input_ids=ids, use_cache=False, **GREEDY)
    model.save_pretrained(folder)
    ha.MemoryModel.from_pretrained(tiny_backbone(family), folder)


@pytest.mark.parametrize("method", sorted(METHOD_CASES))
def test_no_deprecation_warning_from_wrap_forward_step_generate_save_and_load(method, tmp_path, caplog):
    families = families_for(method)
    family = "mamba" if "mamba" in families else families[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        with caplog.at_level(logging.WARNING, logger="transformers"):
            every_verb(wrap(method, family), family, tmp_path / "plain")
            lora = add_lora(tiny_backbone(families[0]), rank=2, dropout=0.0)
            every_verb(
                ha.wrap_with_memory(lora, method, segment_length=SEGMENT, **METHOD_CASES[method]),
                families[0],
                tmp_path / "lora",
            )
    deprecations = [r.getMessage() for r in caplog.records if "deprecat" in r.getMessage().lower()]
    assert deprecations == []


def test_generate_takes_the_cache_under_either_name_and_refuses_both():
    model = wrap("hmt", "llama").eval()
    ids = random_ids(1, SEGMENT + 3)
    expected = model.generate(input_ids=ids, **GREEDY)
    for name in ("cache", "past_key_values"):
        state = model.init_memory(1)
        out = model.generate(input_ids=ids, **{name: MemoryGenerationCache(model.runtime, state)}, **GREEDY)
        assert torch.equal(out, expected), name
    with pytest.raises(ValueError, match="not both"):
        model.generate(input_ids=ids, cache=object(), past_key_values=object(), **GREEDY)


def test_the_returned_generation_cache_is_read_under_the_installed_name():
    model = wrap("rmt", "llama").eval()
    ids = random_ids(1, SEGMENT + 3)
    out = model.generate(input_ids=ids, return_dict_in_generate=True, **GREEDY)
    state = compat.output_cache(out).memory_state()
    assert state.segments_seen == (ids.shape[1] + GREEDY["max_new_tokens"] - 1) // SEGMENT


def below(version: str) -> str:
    """A release just under `version` (5.25 -> 5.24.99)."""
    major, minor, *_ = (int(part) for part in version.split("."))
    return f"{major}.{minor - 1}.99" if minor else f"{major - 1}.99.99"


FLOOR, CEILING = compat.TESTED_TRANSFORMERS


@pytest.mark.parametrize(
    "version,warns", [(below(FLOOR), True), (FLOOR, False), (below(CEILING), False), (CEILING, True), ("7.0", True)]
)
def test_a_transformers_release_outside_the_tested_range_is_named_in_a_warning(version, warns):
    message = compat.untested_transformers_message(version)
    assert (message is not None) == warns
    if warns:
        assert version in message and f">={FLOOR},<{CEILING}" in message


def test_the_tested_range_is_the_one_pyproject_declares():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    declared = next(r for r in pyproject["project"]["dependencies"] if r.startswith("transformers"))
    assert declared == f"transformers>={FLOOR},<{CEILING}"
