#!/usr/bin/env bash
# Create .venv-litellm/: LiteLLM's proxy for the side-by-side gateway benchmark
# (python -m benchmarks bench_gateway overhead|capacity). A separate venv so LiteLLM's pins
# never touch the project's own dependencies in .venv/.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-litellm
PY=${PYTHON:-python3.11}
if [ ! -x "$VENV/bin/litellm" ]; then
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip
    "$VENV/bin/pip" install --quiet 'litellm[proxy]'
fi
"$VENV/bin/python" -c 'import importlib.metadata as m; print("litellm", m.version("litellm"))'
