"""What block retrieval costs as the document grows: SmolLM2-135M with `"infllm"` reads one long real text (the
King James Bible, book after book) chunk by chunk, and at each checkpoint (8k, 32k, 128k tokens by default) records
- the process CPU seconds per 1k tokens over the `--span` tokens before it (a chunk's cost at that depth),
- the resident memory then and the peak so far, and the blocks in memory,
- decode tokens/s from the state there: greedy continuation of the next `--new-tokens` tokens, the time of one
  generated token subtracted;
- the bare model's CPU seconds per 1k tokens reading a `--bare-prompt`-token prompt (4k) in one forward, in the same
  run and dtype (`bare_cpu_seconds_per_1k_tokens`: the rate the reader is held to), measured at every checkpoint;
- the bare model's decode tokens/s after a prompt of the first checkpoint's length (8k: its own context), from a
  cache of that prompt filled once at the start (so no prompt is read inside the timing: two 8k prefills subtracted
  from each other left noise larger than 16 decoded tokens), measured the same way;
the two decode rates in `--decode-rounds` interleaved rounds (memory, bare, memory, bare, ...), medians kept with
every round's values, so both see the same machine state.

    python benchmarks/infllm_cost.py --threads 1                      # 8k, 32k, 128k (about 40 CPU-minutes)
    python benchmarks/infllm_cost.py --lengths 8k 32k 128k 1m --fields store_dtype=int8 --name infllm_cost_1m
    python benchmarks/infllm_cost.py --threads 1 --dtype bfloat16     # results/infllm_cost_bf16.json

CPU seconds (one torch thread) rather than wall seconds: the two cores of this machine are shared. Writes
`benchmarks/results/<--name>.json` (default `infllm_cost` for float32, `infllm_cost_bf16` for bfloat16; a top-level
`dtype`) after every checkpoint; `benchmarks/render_docs.py` renders it into
docs/infllm.md (`infllm-scaling`).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import parse_field, peak_rss_bytes, rss_bytes, write_result  # noqa: E402
from hmt_adapters.backbones import smollm2  # noqa: E402
from hmt_adapters.compat import cache_kwargs, output_cache  # noqa: E402
from hmt_adapters.data import load_corpus, tokenize_documents  # noqa: E402
from longcontext import parse_length  # noqa: E402

GB = 2**30


def bible(tokenizer, length: int) -> torch.Tensor:
    """The first `length` tokens of the KJV read book after book (train and held-out books alike: cost only)."""
    split = load_corpus("kjv", test_documents=1)
    ids: list[int] = []
    for part in ("train", "test"):
        for doc in tokenize_documents(split[part], tokenizer)["input_ids"]:
            ids.extend(doc)
            if len(ids) >= length + 1:
                return torch.tensor(ids[: length + 1])
    raise SystemExit(f"the KJV has {len(ids)} tokens, fewer than --lengths asks for ({length + 1})")


def decode_rate(model, prompt: torch.Tensor, new_tokens: int, cache: Any = None, **kwargs) -> float:
    """Greedy tokens/s of `model.generate` continuing `prompt` `[1, n]`: (time for 1 + new_tokens tokens - time for
    1 token) / new_tokens, in process CPU seconds, so the prompt's reading is not counted. `cache`: the backbone's
    cache of all but the prompt's last token, copied for each run (outside the timing)."""

    def timed(count: int) -> float:
        extra = {} if cache is None else cache_kwargs(copy.deepcopy(cache))
        start = time.process_time()
        model.generate(
            input_ids=prompt, max_new_tokens=count, min_new_tokens=count, do_sample=False, **extra, **kwargs
        )
        return time.process_time() - start

    with torch.no_grad():
        return new_tokens / max(timed(1 + new_tokens) - timed(1), 1e-9)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def bare_read_rate(base, prompt: torch.Tensor, rounds: int = 2) -> float:
    """The bare model's process CPU seconds per 1k tokens reading `prompt` `[1, n]` in one forward (no cache kept):
    the least of `rounds` reads, the first of which also warms the kernels."""
    best = float("inf")
    with torch.no_grad():
        for _ in range(rounds):
            start = time.process_time()
            base(prompt, use_cache=False)
            best = min(best, time.process_time() - start)
    return 1000 * best / prompt.shape[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", nargs="+", type=parse_length, default=[8192, 32768, 131072])
    parser.add_argument("--span", type=int, default=4096, help="tokens before each checkpoint its cost averages")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens decoded at each checkpoint")
    parser.add_argument("--fields", nargs="*", type=parse_field, default=[], metavar="NAME=VALUE")
    parser.add_argument("--decode-rounds", type=int, default=3, help="interleaved decode rounds per checkpoint")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="the backbone's weights")
    parser.add_argument("--bare-prompt", type=parse_length, default=4096, help="the bare read rate's prompt")
    parser.add_argument("--name", default=None, help="results file name (default: infllm_cost[_bf16])")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.name or {"float32": "infllm_cost", "bfloat16": "infllm_cost_bf16"}[args.dtype]
    base, tokenizer = smollm2(dtype=DTYPES[args.dtype])
    base.eval()
    model = ha.wrap_with_memory(base, "infllm", **dict(args.fields)).eval()
    chunk = model.memory_config.segment_length
    lengths = sorted(args.lengths)
    if any(length % chunk for length in lengths) or args.span % chunk:
        raise SystemExit(f"--lengths and --span must be multiples of the chunk, {chunk} tokens")
    ids = bible(tokenizer, max(lengths[-1], args.bare_prompt))
    pad = tokenizer.eos_token_id
    result = {
        "document": "KJV, book after book",
        "dtype": args.dtype,
        "bare_read_prompt_tokens": args.bare_prompt,
        "config": model.memory_config.to_dict(),
        "span": args.span,
        "new_tokens": args.new_tokens,
        "command": " ".join(sys.argv),
        "bare_prompt_tokens": lengths[0],
        "bare_prefilled": True,
        "decode_rounds": args.decode_rounds,
        "checkpoints": {},
    }
    state, seconds = None, []
    bare_prompt = ids[None, : lengths[0]]
    with torch.no_grad():
        bare_cache = output_cache(base(bare_prompt[:, :-1], use_cache=True))
        for start in range(0, lengths[-1], chunk):
            begin = time.process_time()
            _, state = model.step(ids[None, start : start + chunk], state, return_logits=False)
            seconds.append(time.process_time() - begin)
            read = start + chunk
            if read not in lengths:
                continue
            rss, peak = rss_bytes() / GB, peak_rss_bytes() / GB
            last = seconds[-(args.span // chunk) :]
            rounds: dict[str, list[float]] = {"memory": [], "bare": []}
            for _ in range(args.decode_rounds):
                rounds["memory"].append(
                    decode_rate(
                        model, ids[None, read : read + 1], args.new_tokens, memory_state=state, pad_token_id=pad
                    )
                )
                rounds["bare"].append(decode_rate(base, bare_prompt, args.new_tokens, bare_cache, pad_token_id=pad))
            point = {
                "cpu_seconds_per_1k_tokens": 1000 * sum(last) / args.span,
                "bare_cpu_seconds_per_1k_tokens": bare_read_rate(base, ids[None, : args.bare_prompt]),
                "cpu_seconds_so_far": sum(seconds),
                "rss_gb": rss,
                "peak_rss_gb": peak,
                "blocks": int(state.tensors["repr.0"].shape[2]),
                "decode_tokens_per_s": statistics.median(rounds["memory"]),
                "bare_decode_tokens_per_s": statistics.median(rounds["bare"]),
                "decode_rounds": rounds,
            }
            result["checkpoints"][str(read)] = point
            print(read, point, flush=True)
            write_result(name, result)


if __name__ == "__main__":
    main()
