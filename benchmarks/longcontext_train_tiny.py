"""Collect `examples/train_longcontext.py` runs (tiny Llama trained from scratch per method, curriculum to 16
segments, passkey tested up to 1M tokens) into one results file, a plot and the README's table.

    python examples/train_longcontext.py --threads 1 --output runs/lc-tiny-rmt
    python examples/train_longcontext.py --threads 1 --method hmt --output runs/lc-tiny-hmt
    python benchmarks/longcontext_train_tiny.py rmt=runs/lc-tiny-rmt hmt=runs/lc-tiny-hmt

Writes `benchmarks/results/longcontext_train_tiny.json` (each run's report: provenance, command, curriculum history,
accuracy per length and per needle depth) and `.png` (exact passkey accuracy against length, one line per method).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

from common import ROOT, pyplot, write_result

NAME = "longcontext_train_tiny"


def recipe():
    """The recipe script as a module (its argument defaults rebuild each run's command)."""
    spec = importlib.util.spec_from_file_location("train_longcontext", ROOT / "examples" / "train_longcontext.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(args: dict) -> str:
    """The command line of a run: the script and the arguments that differ from its defaults."""
    defaults = vars(recipe().parse_args([]))
    parts = ["python examples/train_longcontext.py"]
    for key, value in args.items():
        if key not in defaults or value == defaults[key]:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            parts.append(flag)
        elif isinstance(value, list):
            parts += [flag, *map(str, value)] if key != "method_option" else [f"{flag} {v}" for v in value]
        else:
            parts += [flag, str(value)]
    return " ".join(parts)


def collect(runs: dict[str, Path]) -> dict:
    """One results payload from each run folder's report.json."""
    out = {}
    for name, folder in runs.items():
        report = json.loads((folder / "report.json").read_text())
        out[name] = {"command": command(report["args"]), **report}
    return {
        "task": "passkey",
        "backbone": "Llama trained from scratch with each memory (see args: layers, width)",
        "chance_exact": 1e-5,
        "runs": out,
    }


def plot(data: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, run in data["runs"].items():
        rows = sorted(run["accuracy"].values(), key=lambda r: r["tokens"])
        ax.plot(
            [r["tokens"] for r in rows],
            [r["exact"] for r in rows],
            marker="o",
            label=f"{name} (trained to {run['last_level_trained']} segments)",
        )
    longest_trained = max(run["last_level_trained"] * run["args"]["segment_length"] for run in data["runs"].values())
    ax.axvspan(0, longest_trained, color="0.9", label="trained lengths")
    ax.set_xscale("log")
    ax.set(
        xlabel="prompt length (tokens)",
        ylabel="exact passkey accuracy",
        ylim=(-0.05, 1.05),
        title=f"Tiny Llama + memory, curriculum to {max(max(r['args']['levels']) for r in data['runs'].values())} "
        f"segments of {next(iter(data['runs'].values()))['args']['segment_length']} tokens: passkey",
    )
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def readme_section(data: dict) -> str:
    """The README's table: per length, each method's correct / samples (needle depths spread 0 to 1)."""
    runs = data["runs"]
    prov = data.get("provenance", {})
    lines = []
    for name, run in runs.items():
        p = run["provenance"]
        evaluation = sum(r["seconds"] for r in run["accuracy"].values()) / 60
        lines.append(
            f"- `{name}`: `{run['command']}` (commit `{(p.get('git_commit') or '?')[:10]}`, {p['device']}, "
            f"{p['machine']}): {run['steps']} steps to {run['last_level_trained']} segments in "
            f"{run['train_seconds'] / 60:.1f} min, evaluation {evaluation:.1f} min"
        )
    lengths = sorted({int(n) for run in runs.values() for n in run["accuracy"]})
    lines += ["", "| segments | tokens | " + " | ".join(runs) + " |", "|---|---|" + "---|" * len(runs)]
    for n in lengths:
        cells = []
        for run in runs.values():
            row = run["accuracy"].get(str(n))
            cells.append(
                ""
                if row is None
                else f"{row['exact']:.2f} ({row['correct']}/{row['samples']})" + ("" if row["trained"] else " \\*")
            )
        tokens = n * next(iter(runs.values()))["args"]["segment_length"]
        lines.append(f"| {n} | {tokens:,} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "\\* a length never trained on. Exact match of the 5-digit key (chance 0.00001); samples per cell "
        "in brackets, their needles at depths evenly spread from the start (0) to the end (1) of the haystack. "
        f"Collected by `python benchmarks/{NAME}.py` ({prov.get('time', '')}).",
        "",
        f"![passkey accuracy against length](benchmarks/results/{NAME}.png)",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", metavar="NAME=FOLDER", help="a label and the run's --output folder")
    args = parser.parse_args()
    runs = {}
    for item in args.runs:
        name, sep, folder = item.partition("=")
        if not sep or not (Path(folder) / "report.json").is_file():
            raise SystemExit(f"Expected NAME=FOLDER with FOLDER/report.json, got {item!r}.")
        runs[name] = Path(folder)
    path = write_result(NAME, collect(runs))
    plot(json.loads(path.read_text()), path.with_suffix(".png"))
    print(readme_section(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
