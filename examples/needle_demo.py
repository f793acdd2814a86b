"""More context than the model was trained on, with no training: SmolLM2-135M (8k positions) asked about a 16k-token
document, bare and with InfLLM's block-retrieval memory (`wrap_with_memory(base, "infllm")`, docs/infllm.md).

The document is RULER's single needle (niah_single_1: "One of the special magic numbers for <name> is: <7 digits>.")
in the repeated noise haystack, the needle a quarter of the way in. The bare model reads the last 8192 tokens (its
context; the needle is not in them); the memory model reads all of it with `ha.ask`, the document once and then the
question. The 25-sample cells behind this (4k-32k) are in docs/infllm.md.

    python examples/needle_demo.py [--length 16384] [--out demo_output]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import hmt_adapters as ha
from hmt_adapters.backbones import smollm2
from hmt_adapters.evaluation import TASKS, score

QUESTION_START = "\nWhat is the special magic number"


def run(out_dir: str, length: int = 16384, **infllm_fields: int) -> dict:
    """Both answers to one needle prompt of `length` tokens, written to `out_dir/needle.json`."""
    start = time.time()
    base, tokenizer = smollm2()
    base.eval()
    context_size = base.config.max_position_embeddings
    sample = TASKS["niah_single_noise"](tokenizer, length, seed=0, depth=0.25)
    text = tokenizer.decode(sample.input_ids, skip_special_tokens=True)
    cut = text.rindex(QUESTION_START)
    document, question = text[:cut], text[cut + 1 :]
    pad = tokenizer.eos_token_id
    ids = tokenizer(document + "\n" + question, return_tensors="pt").input_ids
    new_tokens = 12
    kept = ids[:, -(context_size - new_tokens) :]  # what the bare model can read: its trained context, answer included
    with torch.no_grad():
        bare = base.generate(
            kept, attention_mask=torch.ones_like(kept), max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad
        )
    bare_answer = tokenizer.decode(bare[0, kept.shape[1] :], skip_special_tokens=True).strip()
    model = ha.wrap_with_memory(base, "infllm", **infllm_fields).eval()
    memory_answer = ha.ask(model, document, question, tokenizer, max_new_tokens=new_tokens)
    rows = [
        {"reader": f"bare SmolLM2-135M (its last {kept.shape[1]} tokens)", "answer": bare_answer},
        {"reader": f"SmolLM2-135M + infllm (all {ids.shape[1]} tokens)", "answer": memory_answer},
    ]
    for row in rows:
        row["correct"] = bool(score(sample.extra["metric"], row["answer"], sample.answers))
    result = {
        "length": ids.shape[1],
        "context": context_size,
        "needle_token": sample.inserts[0].position,
        "expected": sample.answers[0],
        "question": question,
        "rows": rows,
        "seconds": time.time() - start,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "needle.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    return result


def report(result: dict) -> str:
    lines = [
        f"A {result['length']}-token document (the model was trained on {result['context']}), the needle at token "
        f"{result['needle_token']}; expected answer {result['expected']}.",
        f"Question: {result['question']!r}",
        "",
        "| reader | answer | correct |",
        "|---|---|---|",
    ]
    lines += [f"| {r['reader']} | {r['answer']!r} | {'yes' if r['correct'] else 'no'} |" for r in result["rows"]]
    return "\n".join(lines) + f"\n({result['seconds']:.0f} s)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--out", default="demo_output")
    args = parser.parse_args()
    print(report(run(args.out, args.length)))


if __name__ == "__main__":
    main()
