"""The `hmt-adapters` command: questions about a text file from the shell, and lm-eval with memory models.

    hmt-adapters ask --adapter examples/adapters/smollm2-infllm --file book.txt --question "Who is Anne?"
    cat book.txt | hmt-adapters ask --method infllm --base smollm2 --question "..." --question "..."
    hmt-adapters lm-eval --model hmt-adapters --model_args ... --tasks ...    (the `hmt-lm-eval` command)

`ask` reads the document once (a progress bar on standard error while it reads, on a terminal) and prints one answer
per question on standard output, in order. `--state DIR` keeps the read: the state is saved there as the read goes
(`--save-every` tokens) and a later call on the same document continues from it, or, the read finished, answers at
once (docs/generation.md, "A read that survives a restart").
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from typing import Any

DTYPES = ("auto", "float32", "bfloat16", "float16")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hmt-adapters",
        description="Long-context memory for Hugging Face causal LMs, from the shell.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    ask = commands.add_parser(
        "ask",
        help="answer questions about a text file (or standard input) read through memory",
        description="Read a document into memory once and answer each question from it (answers on stdout).",
    )
    source = ask.add_mutually_exclusive_group(required=True)
    source.add_argument("--adapter", help="an adapter folder or Hub repo id (its base model is loaded with it)")
    source.add_argument("--method", help="a memory method wrapped onto --base without an adapter (e.g. infllm)")
    ask.add_argument(
        "--base",
        help="the base model: a known name (smollm2), a folder or a Hub id (with --method, "
        "or to load --adapter onto another base)",
    )
    ask.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config field of the method or adapter (repeatable; values are Python literals)",
    )
    ask.add_argument("--file", default="-", help="the document, a UTF-8 text file ('-' or absent: standard input)")
    ask.add_argument("--question", action="append", required=True, help="a question (repeatable: one read)")
    ask.add_argument("--state", metavar="DIR", help="keep the read in DIR and continue from it (same document)")
    ask.add_argument("--save-every", type=int, metavar="TOKENS", help="with --state: save every TOKENS tokens")
    ask.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the base model's weights (auto: its own, float32 weights read in bfloat16 where this CPU has fast "
        "bfloat16, AMX or AVX512-BF16; --dtype float32 keeps them)",
    )
    ask.add_argument("--max-new-tokens", type=int, default=32, help="the longest answer, in tokens (default 32)")
    ask.add_argument("--separator", default="\n", help="text between the document and each question (a newline)")
    commands.add_parser(
        "lm-eval",
        help="lm-evaluation-harness with `--model hmt-adapters` registered (its own flags; the `eval` extra)",
        add_help=False,
    )
    return parser


def parse_options(pairs: Sequence[str], flag: str = "--option") -> dict[str, Any]:
    """`key=value` strings as config overrides (values are Python literals: `8`, `0.5`, `False`, `[1, 2]`, else
    kept as strings); a pair without `=` is a `ValueError` naming `flag`."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{flag} takes key=value, got {pair!r}.")
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


def fast_bf16() -> str | None:
    """The instruction set that makes bfloat16 matrix products faster than float32 on this CPU (Intel AMX, or
    AVX512-BF16 as on recent AMD EPYC), or None where bfloat16 would be emulated (slower than float32)."""
    import torch

    if torch.cpu._is_amx_tile_supported():
        return "AMX"
    if torch.cpu._is_avx512_bf16_supported():
        return "AVX512-BF16"
    return None


def auto_dtype(model: Any) -> Any:
    """`--dtype auto`: a float32 model on a CPU with fast bfloat16 (`fast_bf16`) cast to bfloat16, said once on
    standard error with the way back (what bfloat16 costs and gains: docs/cost.md, "bfloat16 on the command
    line")."""
    import torch

    parameter = next(model.parameters(), None)
    if parameter is None or parameter.dtype != torch.float32 or parameter.device.type != "cpu":
        return model
    feature = fast_bf16()
    if feature is None:
        return model
    print(
        f"hmt-adapters ask: reading in bfloat16 (this CPU has {feature}); --dtype float32 keeps the float32 weights.",
        file=sys.stderr,
        flush=True,
    )
    return model.to(torch.bfloat16)


def load(args: argparse.Namespace) -> Any:
    """The memory model `ask` reads with: the adapter (onto its own base, or `--base`), or `--method` on `--base`;
    with `--dtype auto`, in bfloat16 where the CPU reads it faster (`auto_dtype`)."""
    import torch

    import hmt_adapters as ha
    from hmt_adapters.auto import load_base_model, load_base_tokenizer

    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    fields = parse_options(args.option)
    if args.method is not None:
        if args.base is None:
            raise SystemExit("hmt-adapters ask: --method needs --base, the model to wrap (e.g. --base smollm2).")
        model = ha.wrap_with_memory(load_base_model(args.base, dtype), args.method, **fields).eval()
        model.tokenizer = load_base_tokenizer(args.base)
    elif args.base is not None:
        model = ha.MemoryModel.from_pretrained(load_base_model(args.base, dtype), args.adapter, inplace=True, **fields)
        if model.tokenizer is None:
            model.tokenizer = load_base_tokenizer(args.base)
    else:
        model = ha.AutoMemoryModelForCausalLM.from_pretrained(args.adapter, dtype=dtype, **fields)
    return auto_dtype(model) if args.dtype == "auto" else model


def run_ask(args: argparse.Namespace) -> int:
    if args.save_every is not None and args.state is None:
        raise SystemExit("hmt-adapters ask: --save-every needs --state DIR, the folder the read is kept in.")
    if args.file == "-":
        document = sys.stdin.read()
    else:
        with open(args.file, encoding="utf-8") as fh:
            document = fh.read()
    if not document.strip():
        raise SystemExit(f"hmt-adapters ask: the document ({args.file if args.file != '-' else 'stdin'}) is empty.")
    import hmt_adapters as ha

    model = load(args)
    if model.tokenizer is None:
        raise SystemExit(
            "hmt-adapters ask: no tokenizer came with the adapter or its base; save one with the adapter."
        )
    answers = ha.ask(
        model,
        document,
        list(args.question),
        separator=args.separator,
        max_new_tokens=args.max_new_tokens,
        state_dir=args.state,
        save_every=args.save_every,
    )
    for answer in answers:
        print(answer.replace("\n", " "), flush=True)
    return 0


def run_lm_eval(argv: list[str]) -> int:
    try:
        from hmt_adapters.evaluation.__main__ import main
    except ImportError as err:
        raise SystemExit(
            f"hmt-adapters lm-eval needs lm-evaluation-harness ({err}): pip install 'hmt-adapters[eval]'."
        ) from err
    sys.argv = ["hmt-adapters lm-eval", *argv]
    main()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The `hmt-adapters` command (console script)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["lm-eval"]:  # every later flag is lm-eval's own
        return run_lm_eval(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return run_ask(args)
    except (ValueError, TypeError, OSError) as err:  # a wrong method, field, path or file: said in one line
        raise SystemExit(f"hmt-adapters ask: {err}") from err


if __name__ == "__main__":
    sys.exit(main())
