# Two commands do all the set-up: `make demo` (the main job) and `make test`.
# Both create .venv on first use and install the project with everything it needs.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[embed,onnx,tokenize,demo,dev]'
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

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
