"""The differences between the transformers releases this package supports, in one place.

Every other module asks here instead of testing `transformers.__version__`. What differs today:

- The name of the cache keyword. transformers 5.24 renamed `past_key_values` (attention models) and `cache_params`
  (Mamba-style models) to `cache` in `generate`, in every model's `forward`, in `masking_utils` and in the model
  outputs; the old names still work there but print a FutureWarning on every call. We read the installed release's
  own list of cache names (`transformers.generation.utils.ALL_CACHE_NAMES`, whose first entry is the name `generate`
  passes to `forward`), so a release is handled by what it does, not by its number.
- peft reading transformers' deprecated `is_gradient_checkpointing` (`peft_on_transformers5`).
- The model classes a text-generation pipeline takes without logging an error (`accept_in_pipelines`).
- The range of releases the test suite has passed on (`TESTED_TRANSFORMERS`); importing the package under a newer
  one warns once, naming that range (docs/development.md, "Upgrading transformers").
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import transformers
from packaging.version import Version
from transformers.generation.utils import ALL_CACHE_NAMES

# The cache keyword of `generate`, `prepare_inputs_for_generation`, every model's `forward` and the model outputs.
CACHE_KWARG: str = ALL_CACHE_NAMES[0]
# Mamba-style models (Mamba, Mamba2, Falcon-Mamba) had a name of their own before the rename.
STATE_SPACE_CACHE_KWARG: str = "cache" if CACHE_KWARG == "cache" else "cache_params"

# The transformers releases the whole test suite passed on (floor inclusive, ceiling exclusive), kept equal to the
# range in pyproject.toml by `python tools/version_matrix.py --refresh-lock` (docs/development.md).
TESTED_TRANSFORMERS: tuple[str, str] = ("5.17.0", "5.26")


def cache_kwargs(cache: Any, state_space: bool = False) -> dict[str, Any]:
    """`{name: cache}` under the name the installed transformers takes, for a model call or an output."""
    return {STATE_SPACE_CACHE_KWARG if state_space else CACHE_KWARG: cache}


def output_cache(output: Any, state_space: bool = False) -> Any:
    """The cache a transformers model output carries, read under the installed release's field name."""
    return output.get(STATE_SPACE_CACHE_KWARG if state_space else CACHE_KWARG)


def one_cache(cache: Any, past_key_values: Any) -> Any:
    """The generation cache given under either name (`cache` from transformers 5.24, `past_key_values` before).

    Both names are accepted on every release so that code written for either keeps working; giving both is an
    error, as in transformers itself.
    """
    if cache is not None and past_key_values is not None:
        raise ValueError("Pass the generation cache as `cache` or as `past_key_values`, not both.")
    return cache if cache is not None else past_key_values


def untested_transformers_message(version: str = transformers.__version__) -> str | None:
    """The warning for a transformers release outside the tested range, or None inside it."""
    floor, ceiling = TESTED_TRANSFORMERS
    installed = Version(version)
    if Version(floor) <= installed < Version(ceiling):
        return None
    return (
        f"hmt-adapters was tested with transformers >={floor},<{ceiling}; transformers {version} is installed. "
        f"It may work, but memory models hook into transformers' attention and generation internals, which change "
        f"between releases: if something fails, install a tested release (pip install 'transformers>={floor},"
        f"<{ceiling}') or the repository's lock (constraints.txt)."
    )


def accept_in_pipelines(class_name: str) -> None:
    """Let `pipeline("text-generation", model=memory_model)` run without its error log.

    A transformers pipeline runs any model that has `generate`, but `Pipeline.check_model_type` logs an error naming
    some 250 classes when the model's class is not one of its task's; peft's `PeftModelForCausalLM` is on that list
    through `transformers.pipelines.base.SUPPORTED_PEFT_TASKS`, and a `MemoryModel` goes beside it there. A release
    without that table is left alone: its pipeline logs its message and still runs (docs/adapters.md)."""
    from transformers.pipelines import base

    tasks = getattr(base, "SUPPORTED_PEFT_TASKS", None)
    if isinstance(tasks, dict) and isinstance(tasks.get("text-generation"), list):
        if class_name not in tasks["text-generation"]:
            tasks["text-generation"].append(class_name)


def warn_if_untested() -> None:
    """Warn once, at import, when the installed transformers is outside the tested range."""
    message = untested_transformers_message()
    if message is not None:
        warnings.warn(message, UserWarning, stacklevel=3)


@contextlib.contextmanager
def peft_on_transformers5() -> Iterator[None]:
    """Silence the FutureWarning peft triggers by reading transformers' deprecated `is_gradient_checkpointing` (peft's
    call, nothing a user can change)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield
