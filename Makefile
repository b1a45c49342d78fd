# The two commands a newcomer needs:   make demo   |   make test
# Both create ./.venv and install everything from this repo's own files.

PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3.10 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
PIP    := $(BIN)/python -m pip
# Installed before requirements.txt: on the CPU machines the 2.13.0 CPU wheel lies on disk; elsewhere
# PyPI's build of the same version is taken (CUDA on Linux). Override e.g. TORCH_SPEC="torch==2.11.0".
TORCH_SPEC ?= torch==2.13.0
HOST   ?= 127.0.0.1
PORT   ?= 7860

.PHONY: demo test lint install install-dev clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.runtime: $(BIN)/python requirements.txt pyproject.toml
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps -e .
	touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements-dev.txt
	$(PIP) install -q -r requirements-dev.txt
	touch $@

install: $(VENV)/.runtime
install-dev: $(VENV)/.dev

## Run the Gradio demo on the embedded sixbit-mini model, offline, at http://$(HOST):$(PORT)
demo: $(VENV)/.runtime
	HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False GRADIO_SERVER_NAME=$(HOST) GRADIO_SERVER_PORT=$(PORT) \
		$(BIN)/python app.py

lint: $(VENV)/.dev
	$(BIN)/ruff check .

## Lint, then the whole test suite (Triton kernels run in TRITON_INTERPRET=1 mode on a CPU-only host)
test: lint
	HF_HUB_OFFLINE=1 GRADIO_ANALYTICS_ENABLED=False $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache test-artifacts
