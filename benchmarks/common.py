"""Shared by the benchmark scripts: a small Llama from a config, timing, peak RSS in a fresh process, FLOP counts,
and the results files (JSON with the run's provenance, plus a PNG)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(ROOT))


def small_llama(
    layers: int = 4,
    dim: int = 256,
    heads: int = 8,
    kv_heads: int = 4,
    ffn: int = 688,
    vocab: int = 8192,
    attn: str = "sdpa",
    seed: int = 0,
) -> torch.nn.Module:
    """A randomly initialised Llama (speed and memory do not depend on trained weights)."""
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn).float().eval()


def interleaved(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Every callable's measurement per round, rounds interleaved (reversed every other round) so that every run sees
    the same machine noise; one warm-up call each."""
    for fn in runs.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(reversed(runs)):
            samples[name].append(runs[name]())
    return samples


def interleaved_medians(runs: dict[str, Callable[[], float]], rounds: int = 5) -> dict[str, float]:
    """Median of what each callable returns (a measurement), by `interleaved`."""
    return {name: statistics.median(v) for name, v in interleaved(runs, rounds).items()}


def interleaved_speed(runs: dict[str, Callable[[], int]], rounds: int = 5) -> dict[str, float]:
    """Median tokens/s of each callable (which returns the tokens it processed), by `interleaved_medians`."""

    def rate(fn: Callable[[], int]) -> Callable[[], float]:
        def timed() -> float:
            start = time.perf_counter()
            tokens = fn()
            return tokens / (time.perf_counter() - start)

        return timed

    return interleaved_medians({name: rate(fn) for name, fn in runs.items()}, rounds)


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's CPU SDPA kernel as its CUDA ones are counted (`flop_counter` has no formula for it)."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def counted_flops(fn: Callable[[], object], attention_module: str = "self_attn") -> dict[str, int]:
    """FLOPs of `fn()` by `torch.utils.flop_counter` (run it on an eager-attention model, so that the backbone's own
    attention is counted as eager computes it; SDPA calls the memory reads make themselves, e.g. a decoded token's,
    count as the query x key rectangle): total, and attention = what runs inside each `attention_module` minus its
    projections (scores, weighted values, memory reading). Counting by module, not by op: linear layers on
    concatenated inputs also dispatch to `bmm`."""
    cpu_sdpa = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
    with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
        fn()
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    attention = sum(
        total - sum(v for child, v in counts.items() if child.startswith(name + "."))
        for name, total in counts.items()
        if name.endswith(attention_module)
    )
    return {"total": counter.get_total_flops(), "attention": attention}


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_ratio(row: dict, lengths: list) -> float:
    """Process peak RSS at the longest of `lengths` over the shortest, from a `{length: {"peak_mb": ...}}` row of
    results (the memory-flatness goal: <= 1.05)."""
    return row[str(lengths[-1])]["peak_mb"] / row[str(lengths[0])]["peak_mb"]


def in_fresh_process(script: str, *args: str, env: dict[str, str] | None = None) -> dict:
    """Run `python script *args` (with `env` added to the environment) and parse the JSON object its last output line
    prints (clean peak RSS)."""
    out = subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}
    )
    if out.returncode:
        raise RuntimeError(f"{script} {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _head_commit() -> str | None:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return None
    return commit or None


# The commit whose code this process runs: read once, when the benchmark starts. A run of hours writes its results
# after later commits have moved HEAD, and it did not run their code.
STARTED_AT_COMMIT = _head_commit()


def commit(data: dict) -> str:
    """A results file's provenance in one phrase: its commit, device and machine."""
    prov = data.get("provenance", {})
    sha = (prov.get("git_commit") or "?")[:10]
    return f"commit `{sha}`, {prov.get('device', 'cpu')}, {prov.get('machine', '')}".rstrip(", ")


def provenance() -> dict:
    """Where and with what a result was produced."""
    return {
        # $HMT_ADAPTERS_COMMIT wins where set: a copied tree's .git can be stale (the GPU machine's was)
        "git_commit": os.environ.get("HMT_ADAPTERS_COMMIT") or STARTED_AT_COMMIT,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def run_provenance() -> dict:
    """The commit and machine of one run, kept in the run's own entry of a results file that `--update` grows run by
    run (the file's `provenance` is the last writer's)."""
    prov = provenance()
    return {"commit": prov["git_commit"], "machine": prov["machine"]}


def previous_runs(name: str, settings_of: Callable[[dict], dict], current: dict) -> dict:
    """The runs of `benchmarks/results/<name>.json`, each keeping its commit and machine, for `--update` (`{}` when
    there is no such file); an error when the file's settings (`settings_of(file)`) are not `current`."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    if settings_of(old) != current:
        raise ValueError(f"{path} was run with other settings ({settings_of(old)}); use another --name.")
    for row in old["runs"].values():
        row.setdefault("commit", old["provenance"]["git_commit"])  # a run from before `run_provenance`
        row.setdefault("machine", old["provenance"]["machine"])
    return old["runs"]


def train_bpe(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE with `vocab_size` entries (one of them `<|endoftext|>`) trained on `texts`, for tiny models
    trained from scratch."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def write_result(name: str, payload: dict) -> Path:
    """`benchmarks/results/<name>.json` with provenance added."""
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**payload, "provenance": provenance()}, indent=2) + "\n")
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def parse_field(text: str) -> tuple[str, Any]:
    """`name=value` (a config field on the command line) with value read as JSON where it parses (numbers,
    true/false, null), else as a string."""
    name, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"config field {text!r} is not name=value")
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value
